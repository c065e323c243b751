"""Regenerate the results tables of README.md and paper/egfuse.md from experiments/results/*.json.

    python experiments/render_results.py

The text between ``<!-- results:start -->`` and ``<!-- results:end -->`` is replaced; nothing else is touched.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
START, END = "<!-- results:start -->", "<!-- results:end -->"


def table() -> str:
    summary = json.loads((RESULTS / "summary.json").read_text())
    lines = []
    cov = summary.get("coverage")
    if cov:
        lines += [
            f"Coverage on the corpus ({summary.get('coverage_models')} exports, "
            f"{summary.get('coverage_blocks_expected')} attention blocks; fused **and** correct on onnxruntime, "
            "see `experiments/results/coverage.md`):",
            "",
            "| onnxruntime optimizer | onnxscript optimize_for_ort | egfuse --target ort | egfuse --target onnx |",
            "|---|---|---|---|",
            f"| {cov.get('ort', 0):.0%} | {cov.get('onnxscript', 0):.0%} | {cov.get('egfuse:ort', 0):.0%} "
            f"| {cov.get('egfuse:onnx', 0):.0%} |",
            "",
        ]
    speed = RESULTS / "optimize_speed.json"
    if speed.exists():
        data = json.loads(speed.read_text())
        deepest = max(data["layers"])
        t = data["families"]["bert"]["table"] if "families" in data else data["table"]

        def cell(tool: str) -> str:
            s = t.get(tool, {}).get(str(deepest)) or t.get(tool, {}).get(deepest)
            return f"{s['median_seconds']:.2f} s" if s and s.get("median_seconds") else "-"

        lines += [
            f"Optimizer time on a {deepest}-layer tiny BERT (median of {data['reps']} interleaved runs; Llama in "
            "`experiments/results/speed.md`):",
            "",
            "| egfuse (ort) | egfuse (ort, with validation) | onnxscript | onnxruntime optimizer |",
            "|---|---|---|---|",
            f"| {cell('egfuse:ort:novalidate')} | {cell('egfuse:ort')} | {cell('onnxscript')} | {cell('ort')} |",
            "",
        ]
    latency = RESULTS / "latency.json"
    if latency.exists():
        data = json.loads(latency.read_text())
        lines += ["Fused-model latency on onnxruntime CPU, relative to the unfused export (lower is faster; "
                  "`experiments/results/latency.md`):", "", data["markdown_table"], ""]  # fmt: skip
    return "\n".join(lines).rstrip() + "\n"


def render(path: Path, body: str) -> bool:
    text = path.read_text()
    if START not in text or END not in text:
        return False
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{START}\n{body}{END}{tail}")
    return True


def latency_into_speed_md() -> None:
    """speed.md carries the fused-model latency table too (one page for every speed figure)."""
    latency, speed = RESULTS / "latency.json", RESULTS / "speed.md"
    if not (latency.exists() and speed.exists()):
        return
    text = speed.read_text().split("\n## Fused-model latency")[0].rstrip()
    table = json.loads(latency.read_text())["markdown_table"]
    speed.write_text(
        f"{text}\n\n## Fused-model latency on onnxruntime CPU\n\nBatch 1, median of interleaved runs; "
        f"ratio to the unfused export in parentheses (`latency.json`).\n\n{table}\n"
    )


def main() -> int:
    latency_into_speed_md()
    body = table()
    for path in (ROOT / "README.md", ROOT / "paper" / "egfuse.md"):
        if path.exists() and render(path, body):
            print(f"updated {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
