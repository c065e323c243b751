"""Does a change to the search keep fusion the same? Fuse a set of models, record report for report what became
of every region, and compare two such records.

A refactor of the search (solving repeated regions once, the region-kind redesign) must fuse the same blocks into
the same ops with the same reasons. This runs egfuse in process on each model and target (validation on, as a user
runs it) and keeps, per model: each attention region's status, op, form and reason, each norm/activation and
rotation's status and op, the written model's op counts and node count. Timing-free, so two runs compare exactly.

    python experiments/same_fusion.py record --out /tmp/before.json          # default models, ort + onnx
    python experiments/same_fusion.py record --out /tmp/after.json
    python experiments/same_fusion.py compare /tmp/before.json /tmp/after.json --md experiments/results/same_fusion.md

To record the code before a change while editing the tree, run ``record`` from a worktree of the older commit
(``git worktree add /tmp/base HEAD``, ``ln -s ../rules /tmp/base/egfuse/rules``, then ``PYTHONPATH=/tmp/base``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"


def default_models(drift_every: int) -> list[Path]:
    """The test corpora: the HF exports, the producers, held-out and half-precision models, and every
    ``drift_every``-th drift export (all 785 take hours on two cores)."""
    models = sorted(DATA.glob("*.onnx"))
    for folder in ("producers", "held_out", "half", "old_dynamo"):
        models += sorted((DATA / folder).rglob("*.onnx"))
    models += sorted((DATA / "drift").rglob("*.onnx"))[::drift_every]
    return models


def _region(entry) -> dict:
    return {"index": entry.index, "status": entry.status, "fused_into": entry.fused_into,
            "form": getattr(entry, "form", None), "reason": entry.reason}  # fmt: skip


def record_one(job: tuple[str, str]) -> tuple[str, dict]:
    """What egfuse made of one model for one target (or the error it raised)."""
    import egfuse

    path, target = job
    key = f"{Path(path).relative_to(REPO)}::{target}"
    start = time.perf_counter()
    try:
        result = egfuse.fuse(path, target=target, validate=True)
    except Exception as err:  # a model egfuse refuses is a row too
        return key, {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    report = result.report
    model = result.model
    ops = Counter(f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in model.graph.node)
    return key, {
        "regions": [_region(r) for r in report.regions],
        "layer_ops": [_region(r) for r in report.layer_ops],
        "rotary": [_region(r) for r in report.rotary],
        "nodes_after": report.nodes_after,
        "validated": report.validated,
        "ops": dict(sorted(ops.items())),
        "distinct_regions": report.stats.get("distinct_regions"),
        "seconds": round(time.perf_counter() - start, 2),
    }


def record(models: list[Path], targets: list[str], out: Path, jobs: int) -> None:
    work = [(str(m), t) for m in models for t in targets]
    rows: dict[str, dict] = {}
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(jobs, maxtasksperchild=8) as pool:
        for done, (key, row) in enumerate(pool.imap_unordered(record_one, work), 1):
            rows[key] = row
            if done % 20 == 0:
                print(f"{done}/{len(work)} in {time.perf_counter() - start:.0f}s", file=sys.stderr, flush=True)
    out.write_text(json.dumps(dict(sorted(rows.items())), indent=1) + "\n")
    print(f"{len(rows)} rows in {time.perf_counter() - start:.0f}s → {out}")


_TIMELESS = ("seconds",)


def _normal(row: dict | None) -> dict | None:
    """A row with unset (None) fields of its entries left out, so records written before a field existed compare."""
    if row is None:
        return None
    return {
        field: [{k: v for k, v in e.items() if v is not None} for e in value] if isinstance(value, list) else value
        for field, value in row.items()
    }


def differences(before: dict, after: dict) -> list[str]:
    """Every way the two records differ, one line each (a row missing on one side counts)."""
    lines = []
    for key in sorted(set(before) | set(after)):
        a, b = _normal(before.get(key)), _normal(after.get(key))
        if a is None or b is None:
            lines.append(f"{key}: only in {'after' if a is None else 'before'}")
            continue
        for field in sorted(set(a) | set(b)):
            if field in _TIMELESS or a.get(field) == b.get(field):
                continue
            lines.append(f"{key}: {field} differs: {json.dumps(a.get(field))[:300]} → {json.dumps(b.get(field))[:300]}")
    return lines


def compare(before_path: Path, after_path: Path, md: Path | None) -> int:
    before, after = json.loads(before_path.read_text()), json.loads(after_path.read_text())
    lines = differences(before, after)
    fused = sum(r["status"] == "fused" for row in after.values() for r in row.get("regions", []))
    regions = sum(len(row.get("regions", [])) for row in after.values())
    seconds = [sum(row.get("seconds", 0) for row in rec.values()) for rec in (before, after)]
    text = [
        "# Same fusion, report for report",
        "",
        f"{len(after)} (model, target) runs; {regions} attention regions, {fused} fused after the change.",
        f"Differences: **{len(lines)}**. Seconds summed over the runs (egfuse in process, validation on): "
        f"{seconds[0]:.0f} before, {seconds[1]:.0f} after.",
        "",
        *(f"- {line}" for line in lines[:200]),
    ]
    print("\n".join(text))
    if md is not None:
        md.write_text("\n".join(text) + "\n")
    return 1 if lines else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--targets", nargs="+", default=["ort", "onnx"])
    rec.add_argument("--models", nargs="*", type=Path, help="default: the test corpora")
    rec.add_argument("--drift-every", type=int, default=8)
    rec.add_argument("--jobs", type=int, default=2)
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    cmp.add_argument("--md", type=Path)
    args = parser.parse_args()
    if args.command == "record":
        models = [m.resolve() for m in args.models] if args.models else default_models(args.drift_every)
        record(models, args.targets, args.out, args.jobs)
        return 0
    return compare(args.before, args.after, args.md)


if __name__ == "__main__":
    sys.exit(main())
