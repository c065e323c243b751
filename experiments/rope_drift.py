"""RoPE across exporter releases: how many rotary embeddings egfuse fuses (into ``RotaryEmbedding``, validated on
onnxruntime with the stored feeds) in each export of the drift corpus that has them, per stack, exporter and target.

    python experiments/rope_drift.py                       # ~15 min on 2 cores; writes results/rope_drift.*
    python experiments/rope_drift.py --name rope_drift_before   # the same at another commit (PYTHONPATH)

Attention coverage across releases is ``drift_coverage.py``'s; this counts the rotations, which a model can
fuse attention without (a rotation that is not fused is a plain value to attention). A row of the markdown
compares with ``results/rope_drift_before.json`` where that exists (the same script at an earlier commit).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
CORPUS = REPO / "tests" / "data" / "drift"


def measure(targets: list[str]) -> dict[str, dict]:
    import egfuse

    rows: dict[str, dict] = {}
    for path in sorted(CORPUS.glob("*/*.onnx")):
        feeds_path = path.with_name(path.name.replace(".onnx", ".feeds.npz"))
        if not feeds_path.exists():
            continue
        feeds = dict(np.load(feeds_path))
        for target in targets:
            start = time.perf_counter()
            try:
                report = egfuse.fuse(path, target=target, feeds=feeds).report
            except Exception as error:  # a row, not the end of the run
                rows[f"{path.relative_to(REPO)}:{target}"] = {"error": f"{type(error).__name__}: {error}"[:200]}
                continue
            if not report.rotary:
                continue
            rows[f"{path.relative_to(REPO)}:{target}"] = {
                "rotary": len(report.rotary),
                "rotary_fused": sum(r.status == "fused" for r in report.rotary),
                "reasons": sorted({r.reason or "" for r in report.rotary if r.status != "fused"})[:2],
                "variants": sorted({r.variant or "" for r in report.rotary}),
                "attention_fused": report.fused,
                "validated": report.validated,
                "seconds": round(time.perf_counter() - start, 2),
            }
            print(path.relative_to(REPO), target, rows[f"{path.relative_to(REPO)}:{target}"], flush=True)
    return rows


def totals(rows: dict[str, dict]) -> dict[tuple[str, str, str], list[int]]:
    """(stack, exporter, target) → [fused, found]; ("all", "", target) over every stack."""
    out: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    for key, row in rows.items():
        if "rotary" not in row:
            continue
        path, target = key.rsplit(":", 1)
        stack, exporter = Path(path).parent.name, "dynamo" if ".dynamo." in path else "torchscript"
        for group in ((stack, exporter, target), ("all", "", target)):
            out[group][0] += row["rotary_fused"]
            out[group][1] += row["rotary"]
    return out


def markdown(rows: dict[str, dict], before: dict[str, dict] | None, targets: list[str]) -> str:
    now, then = totals(rows), totals(before or {})

    def cell(group: tuple[str, str, str], table: dict) -> str:
        fused, found = table.get(group, (0, 0))
        return f"{fused}/{found}" if found else "–"

    lines = ["# RoPE across exporter releases", "",
             "Rotary embeddings fused into `RotaryEmbedding` (the model validated on onnxruntime with the stored "
             "feeds) in the drift corpus's exports that have them, written by `experiments/rope_drift.py`."
             + (" `before`: the same script at the commit `rope_drift_before.json` names." if before else ""), "",
             "| stack | exporter | " + " | ".join(f"{t}{' before | ' + t if before else ''}" for t in targets) + " |",
             "|---|---|" + "---:|" * (len(targets) * (2 if before else 1))]  # fmt: skip
    groups = [*sorted({g[:2] for g in [*now, *then] if g[0] != "all"}), ("all", "")]
    for stack, exporter in groups:
        cells = []
        for t in targets:
            if before:
                cells.append(cell((stack, exporter, t), then))
            cells.append(cell((stack, exporter, t), now))
        lines.append(f"| {stack} | {exporter} | " + " | ".join(cells) + " |")
    missed = [(k, r) for k, r in rows.items() if "rotary" in r and r["rotary_fused"] < r["rotary"]]
    lines += ["", "Not fused (first reason):", ""]
    lines += [f"- `{k}`: {r['rotary'] - r['rotary_fused']} of {r['rotary']} — {(r['reasons'] or [''])[0]}"
              for k, r in missed] or ["- none"]  # fmt: skip
    errors = [k for k, r in rows.items() if "error" in r]
    lines += ["", f"Errors: {len(errors)}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", nargs="+", default=["ort", "onnx"])
    parser.add_argument("--name", default="rope_drift", help="results file name (without extension)")
    parser.add_argument("--render", action="store_true", help="rewrite the .md from the .json, measuring nothing")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    path = RESULTS / f"{args.name}.json"
    if args.render:
        data = json.loads(path.read_text())
    else:
        import subprocess

        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()  # fmt: skip
        data = {"commit": commit, "targets": args.targets, "rows": measure(args.targets)}
        path.write_text(json.dumps(data, indent=1) + "\n")
    before_path = RESULTS / "rope_drift_before.json"
    before = json.loads(before_path.read_text()) if before_path.exists() and args.name == "rope_drift" else None
    text = markdown(data["rows"], before["rows"] if before else None, data["targets"])
    if before:
        text = text.replace("the commit `rope_drift_before.json` names", f"commit {before['commit']}")
    (RESULTS / f"{args.name}.md").write_text(text + f"\nMeasured at commit {data['commit']}.\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
