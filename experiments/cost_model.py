"""Does the cost model predict what onnxruntime measures, and does extraction pick the fastest form?

For each case (an attention block at a shape: encoder, prefill, decode over a cache, grouped K/V heads), every
form the target can write is fused and timed beside the unfused block on this machine's onnxruntime
(:mod:`egfuse.commands.calibrate`: default session options, interleaved runs, medians), and set against the cost the
model predicted for it. Evaluated on shapes the calibration grid did not hold, so the fit is tested, not
echoed.

* ``spearman``: rank correlation of predicted and measured times over every (case, form) — goal ≥ 0.8
* ``median_regret``: per case, measured time of the form extraction chose / the fastest measured − 1,
  the median over cases — goal ≤ 0.05
* ``choice_changes``: blocks whose chosen form differs between two shapes, and whether the measurement
  agrees with both choices

    python experiments/cost_model.py               # evaluate the shipped profile (~5 min on 2 cores)
    python experiments/cost_model.py --calibrate   # first re-fit egfuse/data/ort_profile.json on this machine

Writes results/cost_model.json, results/cost_model.md and results/cost_model.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(ROOT))

from egfuse.commands.calibrate import WIDTH, Case, calibrate, measure  # noqa: E402
from egfuse.targets import get_target  # noqa: E402
from egfuse.targets.ort import PROFILE  # noqa: E402


def evaluation_grid() -> list[Case]:
    """Shapes between and beyond the calibration grid's (which has S = 32/128/512, past = 128/1024)."""
    cases = []
    for seq in (16, 64, 256, 384):
        cases.append(Case(f"encoder S={seq}", {**WIDTH}, {"batch": 1, "seq": seq}))
        cases.append(Case(f"gqa S={seq}", {**WIDTH, "kv_heads": 4, "causal": "trilu"}, {"batch": 1, "seq": seq}))
    for past in (64, 512, 2048):
        step = {"batch": 1, "seq": 1, "past_seq": past}
        cases.append(Case(f"decode past={past}", {**WIDTH, "past": True}, step))
        cases.append(Case(f"gqa decode past={past}", {**WIDTH, "kv_heads": 4, "past": True}, step))
    cases.append(Case("encoder B=4 S=128", {**WIDTH}, {"batch": 4, "seq": 128}))
    return cases


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def block_of(case: str) -> str:
    return case.split(" S=")[0].split(" past=")[0].split(" B=")[0]


def summarise(rows: list[dict]) -> dict:
    by_case: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_case[row["case"]].append(row)
    cases = []
    for name, forms in by_case.items():
        best = min(forms, key=lambda r: r["measured_us"])
        chosen = next((r for r in forms if r["chosen"]), None) or min(forms, key=lambda r: r["predicted_us"])
        cases.append({
            "case": name, "chosen": chosen["form"], "fastest": best["form"],
            "regret": chosen["measured_us"] / best["measured_us"] - 1.0,
        })  # fmt: skip
    changes = []
    by_block: dict[str, list[dict]] = defaultdict(list)
    for case in cases:
        by_block[block_of(case["case"])].append(case)
    for block, members in by_block.items():
        chosen = {c["chosen"] for c in members}
        if len(chosen) > 1:
            confirmed = [c for c in members if c["regret"] <= 0.05]
            changes.append({
                "block": block, "choices": {c["case"]: c["chosen"] for c in members},
                "confirmed_by_measurement": len({c["chosen"] for c in confirmed}) > 1,
            })  # fmt: skip
    return {
        "spearman": spearman([r["predicted_us"] for r in rows], [r["measured_us"] for r in rows]),
        "median_regret": statistics.median(c["regret"] for c in cases),
        "cases": len(rows),
        "per_case": cases,
        "choice_changes": changes,
    }


def write(summary: dict, rows: list[dict], meta: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cost_model.json").write_text(json.dumps({**summary, **meta, "rows": rows}, indent=1) + "\n")
    lines = [
        "# Cost model: predicted vs measured (onnxruntime CPU)",
        "",
        f"Target `{meta['target']}`, profile `{meta['profile']}`, onnxruntime {meta['onnxruntime']}. "
        f"{summary['cases']} (case, form) pairs on shapes the calibration did not see.",
        "",
        f"- **spearman** (predicted vs measured, every pair): **{summary['spearman']:.3f}** (goal ≥ 0.8)",
        f"- **median regret** (chosen form vs fastest, per case): **{summary['median_regret']:.3f}** (goal ≤ 0.05)",
        "",
        "| case | form | op | predicted µs | measured µs | chosen |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = "✔" if r["chosen"] else ""
        lines.append(
            f"| {r['case']} | {r['form']} | {r['op']} | {r['predicted_us']:.0f} | {r['measured_us']:.0f} | {mark} |"
        )
    lines += ["", "| case | chosen | fastest measured | regret |", "|---|---|---|---|"]
    lines += [f"| {c['case']} | {c['chosen']} | {c['fastest']} | {c['regret']:.3f} |" for c in summary["per_case"]]
    if summary["choice_changes"]:
        lines += ["", "Blocks whose chosen form changes with the shape:", ""]
        for change in summary["choice_changes"]:
            choices = ", ".join(f"{k}: {v}" for k, v in change["choices"].items())
            lines.append(f"- {change['block']}: {choices} (measurement agrees: {change['confirmed_by_measurement']})")
    (RESULTS / "cost_model.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 5))
    for form in sorted({r["form"] for r in rows}):
        mine = [r for r in rows if r["form"] == form]
        ax.scatter([r["predicted_us"] for r in mine], [r["measured_us"] for r in mine], label=form, s=18)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted µs (cost model)")
    ax.set_ylabel("measured µs (onnxruntime CPU, median)")
    ax.set_title(f"spearman {summary['spearman']:.2f}, median regret {summary['median_regret']:.3f}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "cost_model.png", dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="ort")
    parser.add_argument("--calibrate", action="store_true", help="re-fit the shipped profile first")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    if args.calibrate:
        print("calibrating (the shipped profile is rewritten) …")
        base = get_target(args.target)
        if args.target == "ort":
            from egfuse.targets.ort import UNCALIBRATED as base
        profile, _ = calibrate(base, rounds=args.rounds)
        PROFILE.write_text(json.dumps(profile, indent=1) + "\n")  # type: ignore[union-attr]
        spec = base.with_profile(profile)
    else:
        spec = get_target(args.target)
    print("evaluating on shapes the calibration did not see …")
    calibration = measure(spec, evaluation_grid(), args.rounds)
    rows = [asdict(r) for r in calibration.rows]
    summary = summarise(rows)
    import onnxruntime

    profile_path = str(Path(str(PROFILE)).resolve().relative_to(ROOT)) if args.target == "ort" else "none"
    write(summary, rows, {"target": args.target, "profile": profile_path, "onnxruntime": onnxruntime.__version__})
    print(f"spearman {summary['spearman']:.3f}, median regret {summary['median_regret']:.3f} over {summary['cases']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
