"""Latency of the fused models on onnxruntime CPU, side by side with the unfused export and the other tools.

Two 4-layer random models of realistic width: BERT-base-shaped (hidden 768, 12 heads) and Llama-shaped
(hidden 768, 12 query heads, 4 KV heads, RoPE, causal), batch 1 at sequence 128 and 512. Variants:
the dynamo export as is, onnxscript's ``optimize_for_ort``, onnxruntime's optimizer, egfuse for each
target, and — what a user with the PyTorch source would try first — the same model re-exported at
``opset_version=23`` (torch then writes the standard ``Attention`` itself for SDPA models).

Sessions use onnxruntime's default options (what users get). Runs are interleaved (variant A, B, … then
again), medians are reported as ratios to the unfused export.

    python experiments/bench_latency.py            # ~15 min on 2 cores
    python experiments/bench_latency.py --quick    # sequence 128 only, fewer runs

Writes results/latency.json (``ratios``: ``{model: {seq: {tool: ratio to the unfused export}}}``, ``verdict``:
the best egfuse target against the best other tool per model and sequence, ``peak``: the GFLOP/s a large
MatMul reaches here and what each fused model achieves), results/latency.md and
``latency_ratio_vs_onnxscript`` in summary.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
REPO = HERE.resolve().parent
RESULTS = HERE / "results"
MODELS = HERE / "corpus" / "latency"
TOOLS = ["onnxscript", "ort", "egfuse:ort", "egfuse:onnx"]


def build(kind: str):
    import torch
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    torch.manual_seed(0)
    if kind == "bert":
        cfg = BertConfig(
            vocab_size=1000,
            hidden_size=768,
            num_hidden_layers=4,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=512,
            attn_implementation="sdpa",
        )
        model = BertModel(cfg, add_pooling_layer=False)
    else:
        cfg = LlamaConfig(
            vocab_size=1000,
            hidden_size=768,
            intermediate_size=2048,
            num_hidden_layers=4,
            num_attention_heads=12,
            num_key_value_heads=4,
            max_position_embeddings=1024,
            use_cache=False,
            attn_implementation="sdpa",
        )
        model = LlamaModel(cfg)

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return Wrapper().eval()


def export(kind: str, opset: int) -> Path:
    import torch

    path = MODELS / f"{kind}_opset{opset}.onnx"
    if path.exists():
        return path
    MODELS.mkdir(parents=True, exist_ok=True)
    model = build(kind)
    ids = torch.randint(0, 1000, (1, 128))
    mask = torch.ones(1, 128, dtype=torch.int64)
    seq = torch.export.Dim("sequence", min=2, max=1024)
    program = torch.onnx.export(
        model,
        (ids, mask),
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_shapes=({1: seq}, {1: seq}),
        opset_version=opset,
        dynamo=True,
    )
    program.save(str(path), external_data=False)
    return path


def optimize(tool: str, source: Path, kind: str) -> tuple[Path | None, str]:
    out = MODELS / f"{kind}.{tool.replace(':', '_')}.onnx"
    if out.exists():
        return out, ""
    cmd = [
        sys.executable,
        str(HERE / "optimize_worker.py"),
        tool,
        str(source),
        "--out",
        str(out),
        "--heads",
        "12",
        "--hidden",
        "768",
        "--model-type",
        "bert" if kind == "bert" else "gpt2",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    record = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    if not record.get("ok"):
        return None, record.get("error", "failed")
    return out, json.dumps(record.get("fused"))


def matmul_peak_gflops(n: int = 2048, runs: int = 5) -> float:
    """The machine's practical peak: onnxruntime's own MatMul on two n×n float32 matrices."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])],
        "peak",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in ("a", "b")],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {x: np.random.default_rng(0).standard_normal((n, n)).astype(np.float32) for x in ("a", "b")}
    session.run(None, feeds)
    best = min(_timed(session, feeds) for _ in range(runs))
    return 2.0 * n**3 / best / 1e9


def _timed(session, feeds) -> float:
    start = time.perf_counter()
    session.run(None, feeds)
    return time.perf_counter() - start


def model_gflop(kind: str, seq: int) -> float:
    """The model's matrix-multiply work at batch 1 (projections, MLP, scores and values), GFLOP."""
    hidden, layers = 768, 4
    if kind == "bert":
        per_layer = 2 * seq * hidden * (4 * hidden + 2 * 3072) + 4 * seq * seq * hidden
    else:  # Llama-shaped: q and o full width, k and v a third (4 of 12 heads), gated MLP
        per_layer = 2 * seq * hidden * (hidden * (2 + 2 / 3) + 3 * 2048) + 4 * seq * seq * hidden
    return layers * per_layer / 1e9


def time_model(path: Path, feeds: dict, runs: int) -> float | str:
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        session.run(None, feeds)  # warm-up
    except Exception as err:
        return f"fails on onnxruntime: {str(err).strip().splitlines()[-1][:120]}"
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    seqs = [128] if args.quick else [128, 512]
    runs = 5 if args.quick else 10
    results: dict = {"seqs": seqs, "reps": args.reps, "runs_per_rep": runs, "models": {}}
    results["peak"] = {"matmul_gflops": round(matmul_peak_gflops(), 1)}
    for kind in ("bert", "llama"):
        source = export(kind, 18)
        variants: dict[str, Path | None] = {"original (dynamo, opset 18)": source}
        notes: dict[str, str] = {}
        for tool in TOOLS:
            variants[tool], notes[tool] = optimize(tool, source, kind)
        try:
            variants["torch opset 23"] = export(kind, 23)
        except Exception as err:  # recorded, not fatal
            variants["torch opset 23"], notes["torch opset 23"] = None, f"export failed: {err}"
        table: dict[str, dict[int, list]] = {name: {s: [] for s in seqs} for name in variants}
        for s in seqs:
            rng = np.random.default_rng(0)
            feeds = {
                "input_ids": rng.integers(0, 1000, (1, s)).astype(np.int64),
                "attention_mask": np.ones((1, s), np.int64),
            }
            for rep in range(args.reps):
                for name, path in variants.items():  # interleaved
                    value = time_model(path, feeds, runs) if path is not None else notes.get(name, "not built")
                    table[name][s].append(value)
                    shown = f"{value * 1000:.1f} ms" if isinstance(value, float) else value[:60]
                    print(f"{kind} S={s} rep {rep + 1} {name:<28} {shown}", flush=True)
        results["models"][kind] = {
            "variants": {k: _relative(v) if v else None for k, v in variants.items()},
            "notes": notes,
            "seconds": table,
        }
    write(results)
    return 0


def _relative(path: Path) -> str:
    """A results file names models relative to the repository, never by this machine's path."""
    return Path(path).resolve().relative_to(REPO).as_posix()


def _median(values: list) -> float | None:
    numbers = [v for v in values if isinstance(v, float)]
    return statistics.median(numbers) if numbers else None


def write(results: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = ["| model | seq | " + " | ".join(next(iter(results["models"].values()))["seconds"]) + " |"]
    lines.append("|---|---|" + "---|" * len(next(iter(results["models"].values()))["seconds"]))
    ratios_vs_onnxscript = {}
    ratios: dict = {}
    verdict: dict = {}
    achieved: dict = {}
    for kind, data in results["models"].items():
        for s in results["seqs"]:
            base = _median(data["seconds"]["original (dynamo, opset 18)"][s])
            if base:
                ratios.setdefault(kind, {})[str(s)] = {
                    name: round(m / base, 3)
                    for name, by_seq in data["seconds"].items()
                    if name != "original (dynamo, opset 18)" and (m := _median(by_seq[s]))
                }
                ours = {k: v for k, v in ratios[kind][str(s)].items() if k.startswith("egfuse")}
                others = {k: v for k, v in ratios[kind][str(s)].items() if not k.startswith("egfuse")}
                if ours and others:
                    best, rival = min(ours, key=ours.get), min(others, key=others.get)
                    verdict.setdefault(kind, {})[str(s)] = {
                        "best_egfuse": best, "ratio": ours[best], "best_other": rival, "other_ratio": others[rival],
                        "egfuse_vs_other": round(ours[best] / others[rival], 3),
                    }  # fmt: skip
                best_seconds = min(
                    (m for by_seq in data["seconds"].values() if (m := _median(by_seq[s]))), default=None
                )
                if best_seconds:
                    achieved.setdefault(kind, {})[str(s)] = round(model_gflop(kind, s) / best_seconds, 1)
            cells = []
            for by_seq in data["seconds"].values():
                m = _median(by_seq[s])
                if m is None:
                    reason = next((v for v in by_seq[s] if isinstance(v, str)), "n/a")
                    cells.append(f"— ({reason[:50]})")
                else:
                    cells.append(f"{m * 1000:.1f} ms ({m / base:.2f}×)" if base else f"{m * 1000:.1f} ms")
            lines.append(f"| {kind} | {s} | " + " | ".join(cells) + " |")
            ours = _median(data["seconds"]["egfuse:ort"][s])
            theirs = _median(data["seconds"]["onnxscript"][s])
            if ours and theirs:
                ratios_vs_onnxscript[f"{kind}_s{s}"] = round(ours / theirs, 3)
    results["ratios"] = ratios
    results["verdict"] = verdict
    results["peak"]["achieved_gflops_fastest"] = achieved
    peak = results["peak"]["matmul_gflops"]
    lines += [
        "",
        "Best egfuse target against the best other tool (ratio of their times; < 1: egfuse faster). The machine's "
        f"MatMul peak: {peak:.0f} GFLOP/s; the fastest variant's matrix work achieves:",
        "",
    ]
    for kind, by_seq in verdict.items():
        for s, v in by_seq.items():
            got = achieved.get(kind, {}).get(s)
            share = f", {got:.0f} GFLOP/s ({got / peak:.0%} of peak)" if got else ""
            lines.append(f"- {kind} S={s}: {v['best_egfuse']} {v['ratio']:.2f}× vs {v['best_other']} "
                         f"{v['other_ratio']:.2f}× → {v['egfuse_vs_other']:.3f}{share}")  # fmt: skip
    results["markdown_table"] = "\n".join(lines)
    (RESULTS / "latency.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (RESULTS / "latency.md").write_text(
        "# Fused-model latency on onnxruntime CPU\n\nBatch 1, median of interleaved runs; ratio to the unfused "
        "export in parentheses (lower is faster).\n\n" + results["markdown_table"] + "\n"
    )
    summary_path = RESULTS / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary["latency_ratio_vs_onnxscript"] = ratios_vs_onnxscript
    summary_path.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.exit(main())
