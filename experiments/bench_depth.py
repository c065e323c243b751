"""Does optimizing stay linear in depth? egfuse on tiny random BERTs from 48 to 240 (or 480) layers.

The speed benchmark (``bench_speed.py``) compares tools up to 48 layers; a user's 480-layer model must not
meet a super-linear stage (e-graph size, extraction, validation) the shallow ones hide. Each depth runs in
its own process (``optimize_worker.py``); the figure to read is the seconds per layer, and its ratio at the
deepest model to the shallowest (1.0 = linear).

    python experiments/bench_depth.py                     # 48, 120, 240 layers (~10 min, most of it export)
    python experiments/bench_depth.py --layers 48 480     # 480 too: torch's dynamo export alone takes > 25 min here

Writes experiments/results/depth.json and depth.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import bench_speed  # noqa: E402

TOOLS = ["egfuse:ort:novalidate", "egfuse:ort"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[48, 120, 240])
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    rows = []
    for layers in args.layers:
        model = bench_speed.export("bert", layers)
        for tool in TOOLS:
            record = bench_speed.run_tool(tool, model, "bert", args.timeout)
            row = {"layers": layers, "tool": tool, "ok": bool(record.get("ok")), "seconds": record.get("seconds"),
                   "peak_rss_mb": record.get("peak_rss_mb"), "fused": record.get("fused"),
                   "error": record.get("error")}  # fmt: skip
            if row["ok"] and row["seconds"]:
                row["seconds_per_layer"] = row["seconds"] / layers
            rows.append(row)
            print(json.dumps(row), flush=True)
    linearity = {}
    for tool in TOOLS:
        done = [r for r in rows if r["tool"] == tool and r.get("seconds_per_layer")]
        if len(done) >= 2:
            linearity[tool] = done[-1]["seconds_per_layer"] / done[0]["seconds_per_layer"]
    result = {
        "family": "bert",
        "hidden": bench_speed.HIDDEN,
        "heads": bench_speed.HEADS,
        "rows": rows,
        "seconds_per_layer_ratio_deepest_to_shallowest": linearity,
        "versions": bench_speed.versions(),
    }
    bench_speed.RESULTS.mkdir(parents=True, exist_ok=True)
    (bench_speed.RESULTS / "depth.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# Optimize time against depth (tiny BERT, dynamo export, SDPA)", "",
             "| layers | tool | seconds | s / layer | peak RSS | fused |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if r["ok"]:
            fused = ", ".join(f"{k} {v}" for k, v in (r["fused"] or {}).items())
            lines.append(f"| {r['layers']} | {r['tool']} | {r['seconds']:.2f} | {r['seconds_per_layer'] * 1e3:.1f} ms "
                         f"| {r['peak_rss_mb']:.0f} MB | {fused} |")  # fmt: skip
        else:
            lines.append(f"| {r['layers']} | {r['tool']} | failed: {r['error']} | | | |")
    lines += ["", "Seconds per layer at the deepest model over the shallowest (1.0 = linear):", ""]
    lines += [f"- {tool}: {ratio:.2f}×" for tool, ratio in linearity.items()]
    (bench_speed.RESULTS / "depth.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
