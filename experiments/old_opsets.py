"""Coverage at the opsets old exports have: TorchScript exports of the corpus's BERT, GPT-2, Llama and GPT-NeoX
(eager attention) at opsets 10 to 17, fused on every target with validation on the export's own feeds.

ONNX models on the Hub were written at opsets 11-14 for years (transformers' ``transformers.onnx``, optimum's
defaults), and egfuse's corpora are at 17 and 18. Per (model, opset, target): attention blocks fused of the
regions found, norms/activations/rotations fused, and whether validation passed. The exports are made here
(``corpus.py``'s builders, exporter ``torchscript-opsetN``), cached under ``--out``.

    python experiments/old_opsets.py                      # 4 models × opsets 10-17 × 3 targets (~4 min)
    python experiments/old_opsets.py --name old_opsets_before   # (run from a worktree of an older commit)

Writes experiments/results/<name>.json and .md. Needs the ``corpus`` extra (torch, transformers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

MODELS = ("bert_eager", "gpt2_eager", "llama_eager", "gpt_neox_eager")
OPSETS = tuple(range(10, 18))
TARGETS = ("ort", "onnx", "npu")


def fuse_row(path: Path) -> dict:
    import egfuse

    feeds = dict(np.load(path.with_name(path.name.replace(".onnx", ".feeds.npz"))))
    row = {}
    for target in TARGETS:
        report = egfuse.fuse(path, target=target, feeds=feeds).report
        others = [*report.layer_ops, *report.rotary]
        kept = [r.reason for r in [*report.regions, *others] if r.status != "fused" and r.reason]
        row[target] = {
            "attention": [report.fused, len(report.regions)],
            "others": [sum(r.status == "fused" for r in others), len(others)],
            "validated": report.validated,
            "kept": sorted({k[:140] for k in kept})[:2],
        }
    return row


def markdown(rows: dict, seconds: float, fingerprint: str) -> str:
    lines = [
        "# Old opsets (old_opsets)",
        "",
        f"TorchScript exports of the corpus's models (eager attention) at opsets 10-17, egfuse as of {fingerprint}, "
        f"{seconds:.0f} s. Each cell: attention blocks fused / found · norms, activations and rotations fused / "
        "found (npu keeps rotations, and below opset 17 writes no LayerNormalization).",
        "",
        "| model | opset | " + " | ".join(f"egfuse:{t}" for t in TARGETS) + " |",
        "|---|---|" + "---|" * len(TARGETS),
    ]
    totals = {t: [0, 0] for t in TARGETS}
    for key, row in rows.items():
        model, opset = key.rsplit("@", 1)
        if "error" in row:
            lines.append(f"| {model} | {opset} | " + " | ".join(["not exported"] * len(TARGETS)) + " |")
            continue
        cells = []
        for t in TARGETS:
            entry = row[t]
            a, o = entry["attention"], entry["others"]
            totals[t][0] += a[0]
            totals[t][1] += a[1]
            cells.append(f"{a[0]}/{a[1]} · {o[0]}/{o[1]}" + ("" if entry["validated"] else " (not validated)"))
        lines.append(f"| {model} | {opset} | " + " | ".join(cells) + " |")
    lines.append("| **all** | | " + " | ".join(f"**{f}/{n}** blocks" for f, n in totals.values()) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE / "corpus" / "old_opsets")
    parser.add_argument("--name", default="old_opsets", help="results file name (without extension)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import corpus
    from fingerprint import source_fingerprint

    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows: dict[str, dict] = {}
    for name in MODELS:
        for opset in OPSETS:
            exporter = f"torchscript-opset{opset}"
            path = args.out / f"{name}.{exporter}.onnx"
            if not path.exists():
                entry = corpus.export(corpus.SPECS[name], exporter, args.out)
                if entry.error:
                    rows[f"{name}@{opset}"] = {"error": entry.error}
                    continue
            rows[f"{name}@{opset}"] = fuse_row(path)
            print(name, opset, {t: rows[f"{name}@{opset}"][t]["attention"] for t in TARGETS}, flush=True)
    seconds = time.perf_counter() - start
    results = HERE / "results"
    fingerprint = source_fingerprint()
    (results / f"{args.name}.json").write_text(json.dumps({"egfuse": fingerprint, "rows": rows}, indent=1))
    (results / f"{args.name}.md").write_text(markdown(rows, seconds, fingerprint))
    return 0


if __name__ == "__main__":
    sys.exit(main())
