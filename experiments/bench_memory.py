"""Peak memory of ``egfuse optimize`` on models whose weights live in an external-data file, against the
weights' size: the goal (issue 37) is a validated peak at most 1 GB over the weights, from 2 GB of weights up.

Each model is one attention block from egfuse's own generator at a width that gives the wanted weight size
(four ``hidden × hidden`` float32 projections), saved with its weights beside it; ``egfuse optimize`` runs in
a child process, with and without validation, and its peak resident memory is read from the kernel
(``wait4``'s ``ru_maxrss``). A Python interpreter with egfuse, egglog, onnx and onnxruntime imported holds
about 0.3 GB before it reads anything; that is counted.

    python experiments/bench_memory.py            # ~1.5 min on 2 cores, 8 GB of disk in the temp dir
    python experiments/bench_memory.py --decoder-7b   # adds a 7B-shaped float16 decoder (big_decoder.py):
                                                      # ~15 min, 28 GB of disk; its rows are kept by later runs

Writes results/memory.json (``runs``: weights_gb, validate, peak_gb, peak_over_weights_gb) and
results/memory.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from egfuse.testing import Variant, attention_model  # noqa: E402

RESULTS = HERE / "results"
GB = 1 << 30


def build(folder: Path, heads: int) -> tuple[Path, float]:
    """One block with ``heads`` heads of 128 features, its weights in ``model.onnx.data`` — built by a child
    process: Linux carries a process's peak resident memory into the programs it starts (``ru_maxrss``
    survives ``exec``), so a bench that held the weights itself would count them in every run it measures."""
    path = folder / f"block_{heads}.onnx"
    subprocess.run([sys.executable, __file__, "--build-one", str(path), str(heads)], check=True)
    return path, (path.parent / f"{path.name}.data").stat().st_size / GB


def _build_one(path: Path, heads: int) -> None:
    model = attention_model(Variant(heads=heads, head_dim=128, k_layout="transpose_0132"))
    onnx.save_model(model, path, save_as_external_data=True, location=f"{path.name}.data", size_threshold=1024)


def peak(argv: list[str]) -> tuple[float, int, float]:
    """Run ``argv``; its peak resident memory in GB, exit code and seconds."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    error = process.stderr.read().decode() if process.stderr else ""
    if process.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(argv)} failed: {error[-400:]}")
    return usage.ru_maxrss * 1024 / GB, process.returncode, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--heads", type=int, nargs="+", default=[32, 64, 106], help="widths: heads of 128 (0.19, 0.75, 2.06 GB)"
    )
    parser.add_argument("--build-one", nargs=2, metavar=("PATH", "HEADS"), help=argparse.SUPPRESS)
    parser.add_argument("--decoder-7b", action="store_true", help="measure only the 7B-shaped float16 decoder")
    args = parser.parse_args(argv)
    if args.build_one:
        _build_one(Path(args.build_one[0]), int(args.build_one[1]))
        return 0
    previous = json.loads((RESULTS / "memory.json").read_text()) if (RESULTS / "memory.json").exists() else {}
    if args.decoder_7b:
        runs = [r for r in previous.get("runs", []) if r.get("model", "block") == "block"] + _decoder_runs()
        baseline = previous.get("interpreter_gb", 0.0)
        return _write(runs, baseline)
    runs = [r for r in previous.get("runs", []) if r.get("model", "block") != "block"]
    baseline, _, _ = peak([sys.executable, "-c", "import egfuse, egglog, onnxruntime, onnx_ir"])
    with tempfile.TemporaryDirectory(prefix="egfuse-bench-memory-") as name:
        folder = Path(name)
        for heads in args.heads:
            model, weights = build(folder, heads)
            runs += _runs(model, weights, {"model": "block", "heads": heads})
            for leftover in folder.glob(f"{model.name}*"):
                leftover.unlink()
    return _write(sorted(runs, key=lambda r: r["weights_gb"]), baseline)


def _decoder_runs() -> list[dict]:
    """``egfuse optimize`` on a 7B-shaped float16 Llama decoder written straight to disk, validated and not."""
    with tempfile.TemporaryDirectory(prefix="egfuse-bench-memory-") as name:
        model = Path(name) / "decoder_7b.onnx"
        subprocess.run([sys.executable, str(HERE / "big_decoder.py"), str(model)], check=True)
        weights = (model.parent / f"{model.name}.data").stat().st_size / GB
        return _runs(model, weights, {"model": "llama-7b-float16"}, with_report=True)


def _runs(model: Path, weights: float, label: dict, with_report: bool = False) -> list[dict]:
    """``egfuse optimize`` on ``model`` in a child process, validated and not: one row each (with the report's
    fused and validated counts where asked), the outputs removed after."""
    runs = []
    out, report_path = model.parent / "fused.onnx", model.parent / "fused.onnx.json"
    for validate in (True, False):
        cli = [sys.executable, "-m", "egfuse", "optimize", str(model), "-o", str(out), "-q"]
        cli += ["--report", str(report_path)] if with_report else []
        gb, code, seconds = peak(cli + ([] if validate else ["--no-validate"]))
        row = {**label, "weights_gb": round(weights, 3), "validate": validate, "exit": code}
        if with_report:
            report = json.loads(report_path.read_text())
            row |= {"fused": report.get("fused"), "validated": report.get("validated")}
        row |= {
            "peak_gb": round(gb, 3),
            "peak_over_weights_gb": round(gb - weights, 3),
            "peak_per_weight": round(gb / weights, 2),
            "seconds": round(seconds, 1),
        }
        runs.append(row)
        print(row, flush=True)
        for leftover in model.parent.glob("fused.onnx*"):
            leftover.unlink()
    return runs


def _write(runs: list[dict], baseline: float) -> int:
    summary = {"interpreter_gb": round(baseline, 3), "runs": runs, "command": "python experiments/bench_memory.py"}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "memory.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [
        "# Peak memory of `egfuse optimize` on models with external weights",
        "",
        f"`{summary['command']}`; an interpreter with egfuse's imports holds {baseline:.2f} GB before reading.",
        "",
        "| model | weights (GB) | validation | peak (GB) | peak − weights (GB) | peak / weights | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        model = "one attention block" if r.get("model", "block") == "block" else r["model"]
        if "fused" in r:
            model += f" (attention fused {r['fused']}, validated {r['validated']})"
        lines.append(
            f"| {model} | {r['weights_gb']:.2f} | {'on' if r['validate'] else 'off'} | {r['peak_gb']:.2f} | "
            f"{r['peak_over_weights_gb']:.2f} | {r['peak_per_weight']:.2f} | {r['seconds']} |"
        )
    (RESULTS / "memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
