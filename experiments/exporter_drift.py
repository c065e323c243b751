"""Exporter drift: does fusion survive a transformers/torch upgrade? Coverage (attention blocks fused *and*
numerically correct) of each tool per release of the exporter stack, from the drift corpus measurement.

The measurement itself is ``drift_coverage.py`` (every export of ``tests/data/drift/`` through every tool,
checked on onnxruntime: about an hour); this script reads its results and writes the view the paper's
headline needs — coverage per tool across releases, per exporter and over both, how far each tool's coverage
moves from one release to the next, and egfuse's own coverage before its drift work
(``drift_coverage_before.json``, the same corpus measured at the commit before it) as the reference point.

    python experiments/exporter_drift.py

Writes results/exporter_drift.{json,md} and results/exporter_drift.png (when matplotlib imports).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
EXPORTERS = ("torchscript", "dynamo")
BEFORE = "egfuse:ort before the drift work"


def _cell(table: dict, stack: str, exporter: str, tool: str) -> dict[str, int]:
    row = table.get(f"{stack}/{exporter}/{tool}", {"expected": 0, "correct": 0})
    return {"correct": int(row["correct"]), "expected": int(row["expected"])}


def _share(counts: dict[str, int]) -> float | None:
    return round(counts["correct"] / counts["expected"], 4) if counts["expected"] else None


def coverage(drift: dict, tools: list[str]) -> dict[str, dict[str, dict]]:
    """tool → stack → {exporter: counts and share, "both": counts and share}."""
    table = dict(drift["table"])
    out: dict[str, dict[str, dict]] = {}
    for tool in tools:
        out[tool] = {}
        for stack in drift["stacks"]:
            cells = {exporter: _cell(table, stack, exporter, tool) for exporter in EXPORTERS}
            both = {key: sum(c[key] for c in cells.values()) for key in ("correct", "expected")}
            out[tool][stack] = {name: {**c, "share": _share(c)} for name, c in {**cells, "both": both}.items()}
    return out


def movement(per_stack: dict[str, dict]) -> dict[str, float | None]:
    """How coverage moves across releases (both exporters): lowest, highest, and the largest change between
    consecutive releases (the drop or rise an upgrade brings)."""
    shares = [cell["both"]["share"] for cell in per_stack.values() if cell["both"]["share"] is not None]
    steps = [abs(b - a) for a, b in itertools.pairwise(shares)]
    return {
        "lowest": min(shares, default=None),
        "highest": max(shares, default=None),
        "largest_step": round(max(steps), 4) if steps else None,
    }


def build() -> dict:
    drift = json.loads((RESULTS / "drift_coverage.json").read_text())
    tools = list(drift["tools"])
    result = {
        "source": "experiments/results/drift_coverage.json",
        "releases": drift["stacks"],
        "tools": tools,
        "exporters": list(EXPORTERS),
        "coverage": coverage(drift, tools),
    }
    before_path = RESULTS / "drift_coverage_before.json"
    if before_path.exists():
        before = json.loads(before_path.read_text())
        result["coverage"][BEFORE] = coverage(before, ["egfuse:ort"])["egfuse:ort"]
        result["tools"].append(BEFORE)
        result["before_source"] = "experiments/results/drift_coverage_before.json"
    result["movement"] = {tool: movement(result["coverage"][tool]) for tool in result["tools"]}
    totals = {}
    for tool in result["tools"]:
        counts = [cell["both"] for cell in result["coverage"][tool].values()]
        total = {key: sum(c[key] for c in counts) for key in ("correct", "expected")}
        totals[tool] = {**total, "share": _share(total)}
    result["all_releases"] = totals
    return result


def _percent(cell: dict) -> str:
    return "—" if cell["share"] is None else f"{100 * cell['share']:.0f}% ({cell['correct']}/{cell['expected']})"


def markdown(result: dict) -> str:
    tools = result["tools"]
    lines = [
        "# Exporter drift (exporter_drift)",
        "",
        "Attention blocks fused **and** correct per release of the exporter stack (transformers + torch), both",
        "exporters together and each alone; from `drift_coverage.json` (every export of `tests/data/drift/`",
        "through every tool, checked on onnxruntime CPU). "
        f"`{BEFORE}` is the same corpus measured before egfuse's drift work (`drift_coverage_before.json`).",
        "",
        "| release | transformers | torch | " + " | ".join(tools) + " |",
        "|---|---|---|" + "---|" * len(tools),
    ]
    for stack, versions in result["releases"].items():
        cells = [_percent(result["coverage"][tool][stack]["both"]) for tool in tools]
        lines.append(f"| {stack} | {versions['transformers']} | {versions['torch']} | " + " | ".join(cells) + " |")
    lines.append("| **all** | | | " + " | ".join(_percent(result["all_releases"][t]) for t in tools) + " |")
    for exporter in EXPORTERS:
        lines += [
            "",
            f"## {exporter} exports",
            "",
            "| release | " + " | ".join(tools) + " |",
            "|---|" + "---|" * len(tools),
        ]
        for stack in result["releases"]:
            lines.append(
                f"| {stack} | " + " | ".join(_percent(result["coverage"][t][stack][exporter]) for t in tools) + " |"
            )
    lines += ["", "## How coverage moves across releases (both exporters)", ""]
    lines += ["| tool | lowest | highest | largest change between consecutive releases |", "|---|---|---|---|"]
    for tool, move in result["movement"].items():
        cells = [
            "—" if v is None else f"{100 * v:.0f} pts" if k == "largest_step" else f"{100 * v:.0f}%"
            for k, v in move.items()
        ]
        lines.append(f"| {tool} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    stacks = list(result["releases"])
    figure, axes = plt.subplots(1, 3, figsize=(13, 4.3), sharey=True)
    for axis, view in zip(axes, ("both", *EXPORTERS), strict=True):
        for index, tool in enumerate(result["tools"]):
            shares = [result["coverage"][tool][s][view]["share"] for s in stacks]
            style = "--" if tool == BEFORE else "-"
            size = max(3, 9 - 2 * index)  # lines that coincide (egfuse's targets) stay visible: thick under thin
            percent = [None if v is None else 100 * v for v in shares]
            axis.plot(
                stacks, percent, style, marker="os^Dvx"[index % 6], markersize=size, linewidth=size / 3, label=tool
            )
        axis.set_title("both exporters" if view == "both" else f"{view} exports")
        axis.set_xlabel("release (transformers + torch)")
        axis.tick_params(axis="x", rotation=45)
        axis.set_ylim(-3, 103)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("attention blocks fused and correct (%)")
    figure.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(result["tools"]), fontsize=8)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def main() -> None:
    result = build()
    (RESULTS / "exporter_drift.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "exporter_drift.md").write_text(markdown(result))
    drawn = plot(result, RESULTS / "exporter_drift.png")
    print(markdown(result))
    print("wrote results/exporter_drift.{json,md}" + (" and .png" if drawn else " (matplotlib missing: no plot)"))


if __name__ == "__main__":
    main()
