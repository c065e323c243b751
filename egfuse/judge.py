"""Judge: run the original and the fused model on onnxruntime and decide what stays.

Graph outputs and every fused region's and rotation's own output are compared; a region that differs is rolled
back (or, where its e-class held another fused form the target can write, tried again with that form banned).
A region downstream of one that differs differs too, so the upstream ones go first (:func:`upstream_only`).
How one feed set is compared lives in :mod:`egfuse.compare_runs`, the float32 copies of a half-precision model in
:mod:`egfuse.float32_copies`; this module decides what their comparisons mean for the report.
"""

from __future__ import annotations

import onnx

from egfuse import fill_reach, inputs, memory, progress, protos, runner, validate
from egfuse.compare_runs import compare_on, compared_outputs
from egfuse.float32_copies import FLOAT32_COPIES_NOTE, does_not_load, float32_copies
from egfuse.report import RegionReport, Report, RotaryReport, Status
from egfuse.search import RegionKey

VALIDATION_ROUNDS = 6
"""Rounds of validate → roll back → re-fuse; the last one rolls back everything that still differs."""


def judge(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    report: Report,
    feeds: dict | None,
    weights: protos.DetachedWeights | None,
    budget: int | None = None,
) -> dict[RegionKey, tuple[str, float]]:
    """Compare graph outputs and every fused region's and rotation's output; return what to roll back. No run
    may hold more than ``budget`` bytes (estimated before it runs)."""
    with runner.kept_sessions():
        return _judge(original, fused, report, feeds, weights, budget)


def _judge(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    report: Report,
    feeds: dict | None,
    weights: protos.DetachedWeights | None,
    budget: int | None,
) -> dict[RegionKey, tuple[str, float]]:
    entries = fused_entries(report)
    names = [r.output for r in entries.values() if r.output]
    progress.stage(f"validating {len(entries)} fused regions on onnxruntime")
    try:
        data, expected = validate.original_outputs(original, feeds, names, weights=weights, budget=budget)
    except memory.OverBudget as err:
        return _over_budget(report, entries, err)
    except Exception as err:
        copies = float32_copies(original, fused, feeds, weights, err)
        if copies is None:
            return _original_does_not_run(report, entries, feeds, err)
        report.notes.append(FLOAT32_COPIES_NOTE)
        wide_original, wide_fused, wide_feeds = copies
        return judge(wide_original, wide_fused, report, wide_feeds, None, budget)
    try:
        actual = validate.run(fused, data, names, weights=weights)
    except Exception as err:
        report.validated = False
        report.validation_note = f"the fused model does not run on onnxruntime: {short(err)}"
        return dict.fromkeys(entries, (f"fused model failed to run: {short(err)}", float("inf")))
    outputs = [o.name for o in original.graph.output]
    regions, cmps = compared_outputs(original, data, expected, actual, names, entries, outputs, weights, budget)
    failing: dict[RegionKey, tuple[str, float]] = {}
    for key, cmp in regions.items():
        entries[key].max_abs_diff = cmp.max_abs_diff
        if not cmp.ok:
            failing[key] = (f"outputs differ from the original by {cmp.max_abs_diff:.3g}", cmp.max_abs_diff)
    # Generated feeds: the masks exercised too (the user's feeds are what the model runs on). A model past
    # protobuf's limit is run once: each further run of a multi-GB model costs its size again.
    if feeds is None and (weights is None or not weights.large):
        _judge_mask_feeds(original, fused, data, names, outputs, entries, weights, budget, failing, cmps)
    for key, why in fill_reach.reached(original, data, entries, weights).items():
        failing.setdefault(key, why)
    return _verdict(report, entries, cmps, failing)


def _over_budget(
    report: Report, entries: dict[RegionKey, RegionReport | RotaryReport], err: memory.OverBudget
) -> dict[RegionKey, tuple[str, float]]:
    """Nothing proven, because the original's run alone would exceed the validation memory budget."""
    report.validated = None
    report.validation_note = (
        f"nothing applied: {err}; raise the budget (Budgets(validation_bytes=…) / --memory-budget GB), give "
        "smaller inputs (feeds= / --feeds), or skip the check (validate=False / --no-validate)"
    )
    return dict.fromkeys(entries, ("not validated (over the validation memory budget)", float("nan")))


def _original_does_not_run(
    report: Report, entries: dict[RegionKey, RegionReport | RotaryReport], feeds: dict | None, err: Exception
) -> dict[RegionKey, tuple[str, float]]:
    """Unproven is not proven: keep the original regions, and say how to give real inputs — or, where no
    input is at fault, that the check can only be skipped."""
    report.validated = None
    if does_not_load(err):  # no input is at fault: onnxruntime refuses the graph itself
        report.validation_note = (
            f"nothing applied: the original model does not load on this onnxruntime ({short(err)}), so no fused "
            "region can be proven against it; whatever the inputs, skipping the check (validate=False / "
            "--no-validate) is the only way to apply one"
        )
        return dict.fromkeys(entries, ("not validated (the original does not load on onnxruntime)", float("nan")))
    if feeds is not None:  # the user's inputs: they are what the model runs on, so say so plainly
        report.validation_note = (
            f"nothing applied: the original model does not run on the given feeds ({short(err)}); check their "
            "shapes against the model's inputs, or skip the check (validate=False / --no-validate)"
        )
        reason = "not validated (the original does not run on the given feeds)"
        return dict.fromkeys(entries, (reason, float("nan")))
    report.validation_note = (
        f"nothing applied: the original model does not run on generated inputs ({short(err)}); "
        "pass real inputs (feeds= / --feeds inputs.npz) or skip the check (validate=False / --no-validate)"
    )
    reason = "not validated (the original does not run on generated inputs)"
    return dict.fromkeys(entries, (reason, float("nan")))


def _judge_mask_feeds(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    data: dict,
    names: list[str],
    outputs: list[str],
    entries: dict,
    weights: protos.DetachedWeights | None,
    budget: int | None,
    failing: dict[RegionKey, tuple[str, float]],
    cmps: list[validate.Comparison],
) -> None:
    """Both models on each mask-exercising feed set made from ``data``: a region failing there is added to
    ``failing`` (unless already there), the graph outputs' comparisons to ``cmps``."""
    for label, masked in inputs.mask_feed_sets(data).items():
        progress.stage(f"validating {len(entries)} fused regions on onnxruntime: {label} feeds")
        # half precision: finite values asked on these feeds, the masks judged on float32 copies of both
        # (not on a redraw: it asks finiteness only, the first large-scores set judges the meaning)
        copies = not inputs.is_redraw(label)
        more = compare_on(
            original, fused, masked, names, outputs, entries, weights, True, budget, float32_copies=copies
        )
        if more is None:
            continue  # the original does not run on these: they say nothing
        for key, diff in more["regions"].items():
            if key not in failing:
                failing[key] = (f"outputs differ from the original by {diff:.3g} on {label} feeds", diff)
        cmps.extend(more["outputs"])


def _verdict(
    report: Report,
    entries: dict[RegionKey, RegionReport | RotaryReport],
    cmps: list[validate.Comparison],
    failing: dict[RegionKey, tuple[str, float]],
) -> dict[RegionKey, tuple[str, float]]:
    """The report's verdict, and what to roll back: graph outputs off with no region singled out roll back all."""
    report.max_abs_diff = max((c.max_abs_diff for c in cmps), default=0.0)
    report.validated = all(c.ok for c in cmps) and not failing
    if not report.validated and not failing:  # outputs off but nothing singled out: roll back all
        failing = dict.fromkeys(entries, (f"graph outputs differ by {report.max_abs_diff:.3g}", report.max_abs_diff))
    return failing


def fused_entries(report: Report) -> dict[RegionKey, RegionReport | RotaryReport]:
    """What validation judges, by the key it rolls back by."""
    entries: dict[RegionKey, RegionReport | RotaryReport] = {
        r.index: r for r in report.regions if r.status == Status.FUSED
    }
    entries.update({("rotary", r.index): r for r in report.rotary if r.status == Status.FUSED})
    entries.update({("layer", r.index): r for r in report.layer_ops if r.status == Status.FUSED})
    return entries


def ban_forms(
    failing: dict[RegionKey, tuple[str, float]], report: Report, banned: dict[int, dict[str, str]]
) -> dict[RegionKey, tuple[str, float]]:
    """Of the failing regions, those to roll back: a region with another fused form the target can write gets
    that form instead (the failed one banned for it, with the reason), and is tried again."""
    rollback = {}
    for key, (reason, diff) in failing.items():
        entry = report.regions[key] if isinstance(key, int) and key < len(report.regions) else None
        if entry is None or entry.form is None:
            rollback[key] = (reason, diff)
            continue
        tried = banned.setdefault(key, {})
        tried[entry.form] = reason
        left = [c for c in entry.candidates if c.get("cost_us") is not None and c["form"] not in (*tried, "unfused")]
        if not left:
            rollback[key] = (reason, diff)
    return rollback


def upstream_only(
    failing: dict[RegionKey, tuple[str, float]], fused: onnx.ModelProto, report: Report
) -> dict[RegionKey, tuple[str, float]]:
    """The failing regions and rotations that no other failing one feeds. A region downstream of one that
    differs (the next layer, the attention reading a rotation) differs too, whether or not it is right:
    rolling back the upstream ones first and judging again keeps the right ones fused."""
    outputs = {key: r.output for key, r in fused_entries(report).items()}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in fused.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    downstream: set[str] = set()
    for key in failing:
        stack = [outputs[key]] if outputs.get(key) else []
        seen: set[str] = set()
        while stack:
            for node in readers.get(stack.pop(), []):
                for out in node.output:
                    if out not in seen:
                        seen.add(out)
                        stack.append(out)
        downstream |= seen
    roots = {key: why for key, why in failing.items() if outputs.get(key) not in downstream}
    return roots or failing


def short(err: BaseException) -> str:
    text = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    return text[:300]
