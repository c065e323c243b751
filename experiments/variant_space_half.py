"""The variant space's float16 spellings alone: the first N of the uniform sample (``variant_space.draw``, seed
2026) whose dtype is float16, run through egfuse's targets and judged as the full sample is
(``variant_space.run_tool``: fused, and ``egfuse.testing.disagreements`` finds nothing). A quick check of the
half-precision work between full runs of ``variant_space.py`` (an hour on 2 cores); about 4 minutes for 150.

    python experiments/variant_space_half.py --first 150                 # ort and onnx targets
    python experiments/variant_space_half.py --summarise OUTCOMES.jsonl  # re-read a run's outcomes

Writes results/variant_space_half.{json,md} (per tool: covered, fused but wrong, the not-covered reasons) and
the outcomes, one JSON line per (spelling, tool), to results/variant_space_half.jsonl.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import variant_space  # noqa: E402
from fingerprint import source_fingerprint  # noqa: E402

from egfuse.commands.fanout import fan_out  # noqa: E402


def run(first: int, tools: tuple[str, ...], out: Path) -> list[dict]:
    sample, _ = variant_space.draw(2000, 2026)
    half = [v for v in sample if v.dtype == "float16"][:first]
    rows = []
    with out.open("w") as sink:
        for i, result in fan_out(variant_space._run_variant, [(v, tools) for v in half], workers=2):
            if isinstance(result, Exception):  # a crashed worker is a row, not the end
                result = {t: {"fused": False, "correct": False, "reason": repr(result)[:200]} for t in tools}
            for tool in tools:
                row = {"tool": tool, "i": i, "variant": asdict(half[i]), **result[tool]}
                rows.append(row)
                sink.write(json.dumps(row) + "\n")
    return rows


def summarise(rows: list[dict]) -> dict:
    tools = sorted({r["tool"] for r in rows})
    summary = {}
    for tool in tools:
        mine = [r for r in rows if r["tool"] == tool]
        reasons = collections.Counter(r["reason"][:90] for r in mine if not (r["fused"] and r["correct"]))
        summary[tool] = {
            "spellings": len(mine),
            "covered": sum(r["fused"] and r["correct"] for r in mine),
            "fused_but_wrong": sum(r["fused"] and not r["correct"] for r in mine),
            "reasons": dict(reasons.most_common(8)),
        }
    return summary


def markdown(result: dict) -> str:
    lines = [
        "# The variant space's float16 spellings (variant_space_half)",
        "",
        f"The first {result['first']} float16 spellings of the uniform sample (seed 2026), egfuse as of "
        f"{result['egfuse']}.",
        "",
        "| tool | covered (fused and correct) | fused but wrong |",
        "|---|---|---|",
    ]
    for tool, s in result["tools"].items():
        share = 100 * s["covered"] / max(s["spellings"], 1)
        lines.append(f"| {tool} | {share:.1f}% ({s['covered']}/{s['spellings']}) | {s['fused_but_wrong']} |")
    lines += ["", "Reasons a spelling is not covered:", ""]
    for tool, s in result["tools"].items():
        lines.append(f"- **{tool}**: " + "; ".join(f"{k} ×{v}" for k, v in s["reasons"].items()))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", type=int, default=150)
    parser.add_argument("--tools", nargs="+", default=["egfuse:ort", "egfuse:onnx"])
    parser.add_argument("--summarise", type=Path, help="read this outcomes file instead of running the tools")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.summarise:
        rows = [json.loads(line) for line in args.summarise.read_text().splitlines()]
    else:
        rows = run(args.first, tuple(args.tools), RESULTS / "variant_space_half.jsonl")
    result = {"first": len({r["i"] for r in rows}), "egfuse": source_fingerprint(), "tools": summarise(rows),
              "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip
    (RESULTS / "variant_space_half.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "variant_space_half.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
