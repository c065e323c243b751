"""Which op grouped-query attention should become on onnxruntime CPU: the standard ``Attention`` (opset 23,
``q_num_heads``/``kv_num_heads``, what egfuse writes for GQA on both targets) or
``com.microsoft.GroupQueryAttention`` (which the issue names as the alternative). Both take (B, S, N·H)
query and (B, S, N_kv·H) key/value here, with K/V heads native, so only the kernels differ:

- prefill (no past), causal: the standard op with ``is_causal=1``; GroupQueryAttention is always causal;
- decode (one new token after a past of P): the standard op with ``past_key``/``past_value`` and no mask (one
  query row sees every key: causal and unmasked agree), GroupQueryAttention with ``seqlens_k`` = P and
  ``total_sequence_length`` = P + 1.

Both are checked to agree (max abs diff) before timing. Runs are interleaved; medians of RUNS runs are reported
as the ratio GroupQueryAttention / standard. ~2 min on 2 cores.

    python experiments/bench_gqa.py

Writes results/gqa.json and results/gqa.md.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from microbench import interleaved_medians, make_model, sessions, write_results
from onnx import TensorProto, helper

HEADS, KV_HEADS, HEAD_SIZE = 32, 8, 64
# (kind, batch B, new tokens S, past P)
CASES = [("prefill", 1, 128, 0), ("prefill", 1, 512, 0), ("decode", 1, 1, 512), ("decode", 4, 1, 1024)]
RUNS = 100


def _float(name: str, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def model(op: str, b: int, s: int, p: int) -> onnx.ModelProto:
    d, dkv = HEADS * HEAD_SIZE, KV_HEADS * HEAD_SIZE
    inputs = [_float("q", [b, s, d]), _float("k", [b, s, dkv]), _float("v", [b, s, dkv])]
    if p:
        inputs += [_float("past_key", [b, KV_HEADS, p, HEAD_SIZE]), _float("past_value", [b, KV_HEADS, p, HEAD_SIZE])]
    outputs = [_float("y", None), _float("present_key", None), _float("present_value", None)]
    past = ["past_key", "past_value"] if p else ["", ""]
    inits = []
    if op == "standard":
        node = helper.make_node(
            "Attention",
            ["q", "k", "v", "", *past],
            ["y", "present_key", "present_value"],
            q_num_heads=HEADS,
            kv_num_heads=KV_HEADS,
            is_causal=0 if p else 1,
        )
    else:
        inits = [
            helper.make_tensor("seqlens_k", TensorProto.INT32, [b], [p + s - 1] * b),
            helper.make_tensor("total_sequence_length", TensorProto.INT32, [], [p + s]),
        ]
        node = helper.make_node(
            "GroupQueryAttention",
            ["q", "k", "v", *past, "seqlens_k", "total_sequence_length"],
            ["y", "present_key", "present_value"],
            domain="com.microsoft",
            num_heads=HEADS,
            kv_num_heads=KV_HEADS,
        )
    return make_model(helper.make_graph([node], op, inputs, outputs, inits))


def main() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for kind, b, s, p in CASES:
        feeds = {
            "q": rng.standard_normal((b, s, HEADS * HEAD_SIZE)).astype(np.float32),
            "k": rng.standard_normal((b, s, KV_HEADS * HEAD_SIZE)).astype(np.float32),
            "v": rng.standard_normal((b, s, KV_HEADS * HEAD_SIZE)).astype(np.float32),
        }
        if p:
            feeds["past_key"] = rng.standard_normal((b, KV_HEADS, p, HEAD_SIZE)).astype(np.float32)
            feeds["past_value"] = rng.standard_normal((b, KV_HEADS, p, HEAD_SIZE)).astype(np.float32)
        contenders = sessions({o: model(o, b, s, p) for o in ("standard", "com.microsoft")})
        outputs = {o: sess.run(None, feeds) for o, sess in contenders.items()}
        diff = max(
            float(np.abs(a - e).max()) for a, e in zip(outputs["com.microsoft"], outputs["standard"], strict=True)
        )
        median = interleaved_medians(contenders, feeds, RUNS)
        rows.append(
            {
                "case": kind,
                "batch": b,
                "new_tokens": s,
                "past": p,
                "median_us": {o: round(v * 1e6, 1) for o, v in median.items()},
                "gqa_over_standard": round(median["com.microsoft"] / median["standard"], 3),
                "max_abs_diff": diff,
            }
        )
        print(rows[-1], flush=True)
    lines = [
        f"# Grouped-query attention on onnxruntime {ort.__version__} CPU: {HEADS} query / {KV_HEADS} kv heads of "
        f"{HEAD_SIZE} (median of {RUNS} interleaved runs)",
        "",
        "| case | B | new tokens | past | standard Attention µs | GroupQueryAttention µs | GQA / standard "
        "| max abs diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        us = r["median_us"]
        lines.append(
            f"| {r['case']} | {r['batch']} | {r['new_tokens']} | {r['past']} | {us['standard']} | "
            f"{us['com.microsoft']} | {r['gqa_over_standard']:.2f}× | {r['max_abs_diff']:.1e} |"
        )
    meta = {"heads": HEADS, "kv_heads": KV_HEADS, "head_size": HEAD_SIZE, "runs": RUNS}
    write_results("gqa", {**meta, "rows": rows}, lines)


if __name__ == "__main__":
    main()
