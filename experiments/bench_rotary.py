"""Why egfuse writes the standard ``RotaryEmbedding``: one rotate-half RoPE on onnxruntime CPU, three ways.

- ``graph``: what exporters write (``x·cos + Concat(−x₂, x₁)·sin``, tables unsqueezed at the head axis);
- ``standard``: the opset-23 ``RotaryEmbedding`` on (B, N, S, H) with (B, S, H/2) tables (what egfuse writes);
- ``com.microsoft``: the contrib ``RotaryEmbedding``, which wants (B, S, N·H) input, position ids and 2D tables
  (the transposes/reshapes around it are part of its price on a (B, N, S, H) tensor).

All three are checked to agree (max abs diff) before timing. Runs are interleaved; medians of 300 runs are
reported as ratios to ``graph``. ~1 min on 2 cores.

    python experiments/bench_rotary.py

Writes results/rotary.json and results/rotary.md.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from microbench import interleaved_medians, make_model, sessions, write_results
from onnx import TensorProto, helper

SHAPES = [(1, 12, 128, 64), (1, 12, 512, 64), (1, 32, 512, 128), (1, 12, 1, 64)]  # (B, N, S, H); S=1: decode
RUNS = 300


def _int64(name: str, values: list[int]) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)


def model(kind: str, b: int, n: int, s: int, h: int) -> onnx.ModelProto:
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, n, s, h]),
        helper.make_tensor_value_info("cos", TensorProto.FLOAT, [b, s, h]),
        helper.make_tensor_value_info("sin", TensorProto.FLOAT, [b, s, h]),
    ]
    inits = [
        _int64("zero", [0]),
        _int64("one", [1]),
        _int64("half", [h // 2]),
        _int64("end", [h]),
        _int64("last", [-1]),
    ]
    node = helper.make_node
    if kind == "graph":
        nodes = [
            node("Unsqueeze", ["cos", "one"], ["cos4"]),
            node("Unsqueeze", ["sin", "one"], ["sin4"]),
            node("Mul", ["x", "cos4"], ["x_cos"]),
            node("Slice", ["x", "zero", "half", "last"], ["x1"]),
            node("Slice", ["x", "half", "end", "last"], ["x2"]),
            node("Neg", ["x2"], ["minus_x2"]),
            node("Concat", ["minus_x2", "x1"], ["rotated"], axis=-1),
            node("Mul", ["rotated", "sin4"], ["rotated_sin"]),
            node("Add", ["x_cos", "rotated_sin"], ["y"]),
        ]
    else:
        nodes = [node("Slice", [t, "zero", "half", "last"], [f"{t}_half"]) for t in ("cos", "sin")]
        if kind == "standard":
            nodes.append(node("RotaryEmbedding", ["x", "cos_half", "sin_half"], ["y"]))
        else:
            inits += [_int64("bsd", [b, s, n * h]), _int64("bsnh", [b, s, n, h]), _int64("positions", [0])]
            nodes += [
                node("Squeeze", ["cos_half", "zero"], ["cos2"]),
                node("Squeeze", ["sin_half", "zero"], ["sin2"]),
                node("Transpose", ["x"], ["x_bsnh"], perm=[0, 2, 1, 3]),
                node("Reshape", ["x_bsnh", "bsd"], ["x3"]),
                node(
                    "RotaryEmbedding", ["x3", "positions", "cos2", "sin2"], ["y3"], domain="com.microsoft", num_heads=n
                ),
                node("Reshape", ["y3", "bsnh"], ["y_bsnh"]),
                node("Transpose", ["y_bsnh"], ["y"], perm=[0, 2, 1, 3]),
            ]
    graph = helper.make_graph(nodes, kind, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return make_model(graph)


def main() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for b, n, s, h in SHAPES:
        theta = rng.standard_normal((b, s, h // 2)).astype(np.float32)
        feeds = {
            "x": rng.standard_normal((b, n, s, h)).astype(np.float32),
            "cos": np.cos(np.concatenate([theta, theta], -1)),
            "sin": np.sin(np.concatenate([theta, theta], -1)),
        }
        contenders = sessions({k: model(k, b, n, s, h) for k in ("graph", "standard", "com.microsoft")})
        outputs = {k: sess.run(None, feeds)[0] for k, sess in contenders.items()}
        median = interleaved_medians(contenders, feeds, RUNS)
        rows.append(
            {
                "shape": [b, n, s, h],
                "median_us": {k: round(v * 1e6, 1) for k, v in median.items()},
                "ratio_to_graph": {k: round(v / median["graph"], 3) for k, v in median.items()},
                "max_abs_diff": {k: float(np.abs(o - outputs["graph"]).max()) for k, o in outputs.items()},
            }
        )
        print(rows[-1])
    lines = [
        f"# RoPE on onnxruntime {ort.__version__} CPU (median of {RUNS} interleaved runs; ratio to the graph)",
        "",
        "| (B, N, S, H) | graph µs | standard RotaryEmbedding | com.microsoft RotaryEmbedding | max abs diff |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ratio, diff = r["ratio_to_graph"], max(r["max_abs_diff"].values())
        lines.append(
            f"| {tuple(r['shape'])} | {r['median_us']['graph']} | {ratio['standard']:.2f}× | "
            f"{ratio['com.microsoft']:.2f}× | {diff:.1e} |"
        )
    write_results("rotary", {"rows": rows}, lines)


if __name__ == "__main__":
    main()
