"""Does fusing inside a merged decoder's branches pay? The latency of a Llama-shaped merged decoder (optimum's
``decoder_model_merged.onnx`` layout, made by ``merged_decoders.py``'s builder: hidden 512, 8 query heads over 4
K/V heads, 4 layers, RoPE) on onnxruntime's CPU provider, as exported and as egfuse (``ort`` target) wrote it:
a decode step over 512 cached tokens (the cached branch) and a prompt of 512 tokens (the other), batch 1,
interleaved runs, medians after warm-up.

    pip install --no-deps optimum==2.1.0 optimum-onnx==0.1.0     # (merged_decoders.py's environment)
    python experiments/bench_merged.py

Writes results/merged_latency.{json,md} (timing and files as the microbenchmarks', ``microbench.py``).
"""

from __future__ import annotations

import platform
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import merged_decoders  # noqa: E402 - experiments/ is not a package
from microbench import interleaved_medians, sessions, write_results  # noqa: E402

LAYERS, WIDTH, HEADS, LENGTH, RUNS, WARM_UP = 4, 512, 8, 512, 30, 5


def _feeds(rng: np.random.Generator, past: int, new: int, cached: bool) -> dict[str, np.ndarray]:
    feeds = {"input_ids": rng.integers(0, 99, (1, new)).astype(np.int64),
             "attention_mask": np.ones((1, past + new if cached else new), np.int64),
             "use_cache_branch": np.array([cached])}  # fmt: skip
    shape = (1, HEADS // 2, past, WIDTH // HEADS)
    for i in range(LAYERS):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def main() -> int:
    import onnx
    import onnxruntime as ort

    import egfuse

    merged_decoders.LAYERS, merged_decoders.WIDTH, merged_decoders.HEADS = LAYERS, WIDTH, HEADS
    with tempfile.TemporaryDirectory() as scratch:
        entry = merged_decoders.build("llama", "sdpa", Path(scratch))
        if entry["error"]:
            raise SystemExit(f"the merged decoder was not made: {entry['error']}")
        original = Path(scratch) / entry["file"]
        result = egfuse.fuse(str(original), target="ort")
        contenders = sessions({"original": onnx.load(original), "egfuse:ort": result.model})
        rng = np.random.default_rng(0)
        rows = {}
        for label, feeds in ((f"decode step over {LENGTH} cached", _feeds(rng, LENGTH, 1, True)),
                             (f"prompt of {LENGTH}", _feeds(rng, 1, LENGTH, False))):  # fmt: skip
            interleaved_medians(contenders, feeds, WARM_UP)  # warm-up rounds, not counted
            medians = {name: s * 1e3 for name, s in interleaved_medians(contenders, feeds, RUNS - WARM_UP).items()}
            rows[label] = {"ms": {n: round(v, 3) for n, v in medians.items()},
                           "ratio": round(medians["egfuse:ort"] / medians["original"], 3)}  # fmt: skip
    report = result.report
    data = {
        "model": {"family": "llama", "layers": LAYERS, "hidden": WIDTH, "heads": HEADS, "kv_heads": HEADS // 2},
        "fused": {"blocks": report.fused, "of": len(report.regions), "validated": report.validated,
                  "ops": report.fused_ops()},
        "rows": rows, "runs": RUNS, "warm_up": WARM_UP,
        "versions": {"python": platform.python_version(), "egfuse": metadata.version("egfuse")},
    }  # fmt: skip
    lines = [
        "# Merged decoder latency (bench_merged)",
        "",
        f"A Llama-shaped merged decoder (optimum's layout; hidden {WIDTH}, {HEADS} query heads over {HEADS // 2} K/V "
        f"heads, {LAYERS} layers) on onnxruntime {ort.__version__} CPU, batch 1, median of "
        f"{RUNS - WARM_UP} interleaved runs; egfuse fused {report.fused}/{len(report.regions)} blocks "
        f"(validated: {report.validated}).",
        "",
        "| step | original | egfuse:ort | ratio |",
        "|---|---|---|---|",
        *(
            f"| {label} | {r['ms']['original']:.2f} ms | {r['ms']['egfuse:ort']:.2f} ms | {r['ratio']:.3f}× |"
            for label, r in rows.items()
        ),
    ]
    write_results("merged_latency", data, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
