"""Judge: run the original and the fused model on onnxruntime and decide what stays.

Graph outputs and every fused region's and rotation's own output are compared; a region that differs is rolled
back (or, where its e-class held another fused form the target can write, tried again with that form banned).
A region downstream of one that differs differs too, so the upstream ones go first (:func:`upstream_only`).
How one feed set is compared lives in :mod:`egfuse.validation.compare_runs`, the float32 copies of a half-precision
model in :mod:`egfuse.validation.float32_copies`; this module decides what their comparisons mean for the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from egfuse import progress
from egfuse.files import protos
from egfuse.report import RegionKey, RegionReport, Report, RotaryReport, Status
from egfuse.validation import fill_reach, inputs, memory, runner, validate
from egfuse.validation.compare_runs import compare_on, compared_outputs
from egfuse.validation.float32_copies import FLOAT32_COPIES_NOTE, float32_copies, not_the_inputs

VALIDATION_ROUNDS = 6
"""Rounds of validate → roll back → re-fuse; the last one rolls back everything that still differs."""


@dataclass
class Verdict:
    """What one validation found, as a value: the search's fixpoint records it in the report
    (:meth:`record`) and rolls back ``failing``."""

    failing: dict[RegionKey, tuple[str, float]]
    """The regions that differ (or were not proven), with why and by how much: what to roll back."""
    validated: bool | None
    """True: every output and region agreed; False: something differed; None: nothing could be proven."""
    note: str | None = None
    """Why nothing could be proven, or what failed to run (the report's ``validation_note``)."""
    max_abs_diff: float | None = None
    """Over the graph outputs, on every feed set compared."""
    diffs: dict[RegionKey, float] = field(default_factory=dict)
    """Each judged region's own output's difference on the first feed set."""
    notes: list[str] = field(default_factory=list)
    """Report-wide notes on how it was judged (on float32 copies of a half-precision model)."""

    def record(self, report: Report) -> None:
        """The verdict written into ``report``: the verdict fields, each judged region's difference, the notes."""
        entries = fused_entries(report)
        for key, diff in self.diffs.items():
            entries[key].max_abs_diff = diff
        report.notes.extend(self.notes)
        report.validated = self.validated
        if self.note is not None:
            report.validation_note = self.note
        if self.max_abs_diff is not None:
            report.max_abs_diff = self.max_abs_diff


def judge(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    report: Report,
    feeds: dict | None,
    weights: protos.DetachedWeights | None,
    budget: int | None = None,
    *,
    half_copies: bool = False,
) -> Verdict:
    """Compare graph outputs and every fused region's own output (``report`` says which were fused); the
    verdict says what to roll back. No run may hold more than ``budget`` bytes (estimated before it runs).
    ``half_copies``: the models are float32 copies of a half-precision one onnxruntime's CPU cannot run, its graph
    outputs held to its precision (:func:`egfuse.validation.compare_runs.compared_outputs`)."""
    with runner.kept_sessions():
        return _judge(original, fused, report, feeds, weights, budget, half_copies)


def _judge(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    report: Report,
    feeds: dict | None,
    weights: protos.DetachedWeights | None,
    budget: int | None,
    half_copies: bool = False,
) -> Verdict:
    entries = fused_entries(report)
    names = [r.output for r in entries.values() if r.output]
    progress.stage(f"validating {len(entries)} fused regions on onnxruntime")
    try:
        data, expected = validate.original_outputs(original, feeds, names, weights=weights, budget=budget)
    except memory.OverBudget as err:
        return _over_budget(entries, err)
    except Exception as err:
        copies = float32_copies(original, fused, feeds, weights, err)
        if copies is None:
            return _original_does_not_run(entries, feeds, err)
        wide_original, wide_fused, wide_feeds = copies
        verdict = judge(wide_original, wide_fused, report, wide_feeds, None, budget, half_copies=True)
        verdict.notes.insert(0, FLOAT32_COPIES_NOTE)
        return verdict
    try:
        actual = validate.run(fused, data, names, weights=weights)
    except Exception as err:
        failing = dict.fromkeys(entries, (f"fused model failed to run: {short(err)}", float("inf")))
        return Verdict(failing, False, f"the fused model does not run on onnxruntime: {short(err)}")
    outputs = [o.name for o in original.graph.output]
    regions, cmps = compared_outputs(
        original, data, expected, actual, names, entries, outputs, weights, budget, outputs_of_half=half_copies
    )
    failing: dict[RegionKey, tuple[str, float]] = {}
    diffs = {key: cmp.max_abs_diff for key, cmp in regions.items()}
    for key, cmp in regions.items():
        if not cmp.ok:
            failing[key] = (f"outputs differ from the original by {cmp.max_abs_diff:.3g}", cmp.max_abs_diff)
    # Generated feeds: the masks exercised too (the user's feeds are what the model runs on). A model past
    # protobuf's limit is run once: each further run of a multi-GB model costs its size again.
    if feeds is None and (weights is None or not weights.large):
        _judge_mask_feeds(original, fused, data, names, outputs, entries, weights, budget, failing, cmps, half_copies)
    for key, why in fill_reach.reached(original, data, entries, weights).items():
        failing.setdefault(key, why)
    return _verdict(entries, cmps, failing, diffs)


def _over_budget(entries: dict[RegionKey, RegionReport | RotaryReport], err: memory.OverBudget) -> Verdict:
    """Nothing proven, because the original's run alone would exceed the validation memory budget."""
    note = (
        f"nothing applied: {err}; raise the budget (Budgets(validation_bytes=…) / --memory-budget GB), give "
        "smaller inputs (feeds= / --feeds), or skip the check (validate=False / --no-validate)"
    )
    return Verdict(
        dict.fromkeys(entries, ("not validated (over the validation memory budget)", float("nan"))), None, note
    )


def _original_does_not_run(
    entries: dict[RegionKey, RegionReport | RotaryReport], feeds: dict | None, err: Exception
) -> Verdict:
    """Unproven is not proven: keep the original regions, and say how to give real inputs — or, where no
    input is at fault, that the check can only be skipped."""
    if not_the_inputs(err):  # onnxruntime refuses the graph itself, or a kernel its element type
        note = (
            f"nothing applied: the original model does not load on this onnxruntime, or one of its ops has no kernel "
            f"for its element type there ({short(err)}), so no fused region can be proven against it; whatever the "
            "inputs, skipping the check (validate=False / --no-validate) is the only way to apply one"
        )
        reason = "not validated (the original does not load on onnxruntime)"
    elif feeds is not None:  # the user's inputs: they are what the model runs on, so say so plainly
        note = (
            f"nothing applied: the original model does not run on the given feeds ({short(err)}); check their "
            "shapes against the model's inputs, or skip the check (validate=False / --no-validate)"
        )
        reason = "not validated (the original does not run on the given feeds)"
    else:
        note = (
            f"nothing applied: the original model does not run on generated inputs ({short(err)}); "
            "pass real inputs (feeds= / --feeds inputs.npz) or skip the check (validate=False / --no-validate)"
        )
        reason = "not validated (the original does not run on generated inputs)"
    return Verdict(dict.fromkeys(entries, (reason, float("nan"))), None, note)


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
    half_copies: bool = False,
) -> None:
    """Both models on each mask-exercising feed set made from ``data``: a region failing there is added to
    ``failing`` (unless already there), the graph outputs' comparisons to ``cmps``."""
    for label, masked in inputs.mask_feed_sets(data).items():
        progress.stage(f"validating {len(entries)} fused regions on onnxruntime: {label} feeds")
        # half precision: finite values asked on these feeds, the masks judged on float32 copies of both
        # (not on a redraw: it asks finiteness only, the first large-scores set judges the meaning)
        copies = not inputs.is_redraw(label)
        more = compare_on(
            original, fused, masked, names, outputs, entries, weights, True, budget, float32_copies=copies,
            outputs_of_half=half_copies,
        )  # fmt: skip
        if more is None:
            continue  # the original does not run on these: they say nothing
        for key, diff in more["regions"].items():
            if key not in failing:
                failing[key] = (f"outputs differ from the original by {diff:.3g} on {label} feeds", diff)
        cmps.extend(more["outputs"])


def _verdict(
    entries: dict[RegionKey, RegionReport | RotaryReport],
    cmps: list[validate.Comparison],
    failing: dict[RegionKey, tuple[str, float]],
    diffs: dict[RegionKey, float],
) -> Verdict:
    """The verdict, and what to roll back: graph outputs off with no region singled out roll back all."""
    max_abs_diff = max((c.max_abs_diff for c in cmps), default=0.0)
    validated = all(c.ok for c in cmps) and not failing
    if not validated and not failing:  # outputs off but nothing singled out: roll back all
        failing = dict.fromkeys(entries, (f"graph outputs differ by {max_abs_diff:.3g}", max_abs_diff))
    return Verdict(failing, validated, max_abs_diff=max_abs_diff, diffs=diffs)


def fused_entries(report: Report) -> dict[RegionKey, RegionReport | RotaryReport]:
    """What validation judges, by the key it rolls back by."""
    return {(r.kind, r.index): r for r in report.entries() if r.status == Status.FUSED}


def ban_forms(
    failing: dict[RegionKey, tuple[str, float]], report: Report, banned: dict[RegionKey, dict[str, str]]
) -> dict[RegionKey, tuple[str, float]]:
    """Of the failing regions, those to roll back: a region with another fused form the target can write gets
    that form instead (the failed one banned for it, with the reason), and is tried again."""
    rollback = {}
    entries = fused_entries(report)
    for key, (reason, diff) in failing.items():
        entry = entries.get(key)
        if entry is None or getattr(entry, "form", None) is None:
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
