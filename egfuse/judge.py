"""Judge: run the original and the fused model on onnxruntime and decide what stays.

Graph outputs and every fused region's and rotation's own output are compared; a region that differs is rolled
back (or, where its e-class held another fused form the target can write, tried again with that form banned).
A region downstream of one that differs differs too, so the upstream ones go first (:func:`upstream_only`).
"""

from __future__ import annotations

import numpy as np
import onnx

from egfuse import fill_reach, inputs, memory, progress, protos, runner, validate
from egfuse.report import RegionReport, Report, RotaryReport
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
        report.validated = None
        report.validation_note = (
            f"nothing applied: {err}; raise the budget (Budgets(validation_bytes=…) / --memory-budget GB), give "
            "smaller inputs (feeds= / --feeds), or skip the check (validate=False / --no-validate)"
        )
        return dict.fromkeys(entries, ("not validated (over the validation memory budget)", float("nan")))
    except Exception as err:
        copies = _float32_copies(original, fused, feeds, weights, err)
        if copies is not None:
            report.notes.append(FLOAT32_COPIES_NOTE)
            wide_original, wide_fused, wide_feeds = copies
            return judge(wide_original, wide_fused, report, wide_feeds, None, budget)
        # Unproven is not proven: keep the original regions, and say how to give real inputs.
        report.validated = None
        if _does_not_load(err):  # no input is at fault: onnxruntime refuses the graph itself
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
    try:
        actual = validate.run(fused, data, names, weights=weights)
    except Exception as err:
        report.validated = False
        report.validation_note = f"the fused model does not run on onnxruntime: {short(err)}"
        return dict.fromkeys(entries, (f"fused model failed to run: {short(err)}", float("inf")))
    outputs = [o.name for o in original.graph.output]
    regions, cmps = _judged(original, data, expected, actual, names, entries, outputs, weights, budget)
    failing: dict[RegionKey, tuple[str, float]] = {}
    for key, cmp in regions.items():
        entries[key].max_abs_diff = cmp.max_abs_diff
        if not cmp.ok:
            failing[key] = (f"outputs differ from the original by {cmp.max_abs_diff:.3g}", cmp.max_abs_diff)
    # Generated feeds: the masks exercised too (the user's feeds are what the model runs on). A model past
    # protobuf's limit is run once: each further run of a multi-GB model costs its size again.
    if feeds is None and (weights is None or not weights.large):
        for label, masked in inputs.mask_feed_sets(data).items():
            progress.stage(f"validating {len(entries)} fused regions on onnxruntime: {label} feeds")
            # half precision: finite values asked on these feeds, the masks judged on float32 copies of both
            # (not on a redraw: it asks finiteness only, the first large-scores set judges the meaning)
            float32_copies = not inputs.is_redraw(label)
            more = _compare_on(
                original, fused, masked, names, outputs, entries, weights, True, budget, float32_copies=float32_copies
            )
            if more is None:
                continue  # the original does not run on these: they say nothing
            for key, diff in more["regions"].items():
                if key not in failing:
                    failing[key] = (f"outputs differ from the original by {diff:.3g} on {label} feeds", diff)
            cmps.extend(more["outputs"])
    for key, why in fill_reach.reached(original, data, entries, weights).items():
        failing.setdefault(key, why)
    report.max_abs_diff = max((c.max_abs_diff for c in cmps), default=0.0)
    report.validated = all(c.ok for c in cmps) and not failing
    if not report.validated and not failing:  # outputs off but nothing singled out: roll back all
        failing = dict.fromkeys(entries, (f"graph outputs differ by {report.max_abs_diff:.3g}", report.max_abs_diff))
    return failing


def _compare_on(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    data: dict,
    names: list[str],
    outputs: list[str],
    entries: dict,
    weights: protos.DetachedWeights | None,
    finite_only: bool = False,
    budget: int | None = None,
    copies: bool = False,
    float32_copies: bool = True,
) -> dict | None:
    """Both models on ``data``: the failing regions (key → max diff) and the graph outputs' comparisons; None
    where the original does not run on them. ``float32_copies``: a half-precision model judged for finiteness
    is also judged on float32 copies of both (:func:`_compare_widened`)."""
    try:
        expected = validate.run(original, data, names, weights=weights)
    except Exception:
        return None
    try:
        actual = validate.run(fused, data, names, weights=weights)
    except Exception:
        return {"regions": dict.fromkeys(entries, float("inf")), "outputs": []}
    regions, compared = _judged(
        original, data, expected, actual, names, entries, outputs, weights, budget, True, finite_only, copies
    )
    failing = {key: c.max_abs_diff for key, c in regions.items() if not c.ok}
    if finite_only and float32_copies and _half(expected):
        wide = _compare_widened(original, fused, data, names, outputs, entries, weights, budget)
        for key, diff in wide["regions"].items():
            failing.setdefault(key, diff)
        compared.extend(wide["outputs"])
    return {"regions": failing, "outputs": compared}


def _half(outputs: dict) -> bool:
    return any(np.issubdtype(v.dtype, np.floating) and np.finfo(v.dtype).bits <= 16 for v in outputs.values())


def _compare_widened(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    data: dict,
    names: list[str],
    outputs: list[str],
    entries: dict,
    weights: protos.DetachedWeights | None,
    budget: int | None,
) -> dict:
    """A half-precision model on mask-exercising feeds, judged on float32 copies of both models.

    Those feeds make query rows whose every key is masked — by design (a batch row all padding) or by padding
    on the left under a causal mask. In half precision such a row is the fill's rounding, which no kernel is
    bound to reproduce (only finiteness is asked of it there), so a fused op that gives 0, or anything else,
    in place of what the graph computes would go unseen; widened, the fill no longer rounds the scores away
    and the row has one answer, which the fused model must give too. Nothing is judged
    (empty) for a model past protobuf's limit, where the copies would cost its weights twice more, or where
    the widened original does not run."""
    nothing: dict = {"regions": {}, "outputs": []}
    if weights is not None and weights.large:
        return nothing
    wide = _widened_copies(original, fused, weights)
    data = validate.upcast_feeds(data, fills=True)
    try:
        memory.check(wide[0], data, budget, weights_mapped=False)
    except memory.OverBudget:
        return nothing
    return _compare_on(wide[0], wide[1], data, names, outputs, entries, None, budget=budget, copies=True) or nothing


def _judged(
    original: onnx.ModelProto,
    data: dict,
    expected: dict,
    actual: dict,
    names: list[str],
    entries: dict,
    outputs: list[str],
    weights: protos.DetachedWeights | None,
    budget: int | None,
    where_defined: bool = False,
    finite_only: bool = False,
    copies: bool = False,
) -> tuple[dict[RegionKey, validate.Comparison], list[validate.Comparison]]:
    """The comparisons on one feed set (``copies``: float32 copies of a half-precision model, see
    :func:`egfuse.validate.compare`'s ``copy_of_half``); where one fails, judged again against a float64 run
    of the original (only then: it costs a run of a widened copy) — a row a finite fill hides entirely is
    decided by rounding."""
    how = {"where_defined": where_defined, "finite_only": finite_only, "copy_of_half": copies}
    if validate.reference_unread(expected, finite_only):
        return _comparisons(expected, actual, {}, entries, outputs, **how)
    reference = validate.references(original, data, expected, names, weights=weights, budget=budget)
    regions, compared = _comparisons(expected, actual, reference, entries, outputs, **how)
    absorbed: dict = {}
    if not all(c.ok for c in [*regions.values(), *compared]) and reference and _half(expected):
        # half precision: a row a fill hides entirely has two correct values (validate.fill_decided)
        absorbed = validate.references(original, data, expected, names, weights=weights, budget=budget, fills=True)
        regions, compared = _comparisons(expected, actual, reference, entries, outputs, **how, absorbed=absorbed)
    if not all(c.ok for c in [*regions.values(), *compared]):
        wide = validate.references(original, data, expected, names, weights=weights, budget=budget, float32_too=True)
        if wide:
            fill = validate.largest_fill(original, data)
            regions, compared = _comparisons(
                expected, actual, {**wide, **reference}, entries, outputs, **how, fill=fill, absorbed=absorbed
            )
    return regions, compared


def _comparisons(
    expected: dict,
    actual: dict,
    reference: dict,
    entries: dict,
    outputs: list[str],
    *,
    where_defined: bool,
    finite_only: bool = False,
    fill: float = 0.0,
    copy_of_half: bool = False,
    absorbed: dict | None = None,
) -> tuple[dict[RegionKey, validate.Comparison], list[validate.Comparison]]:
    """Each fused entry's output and each graph output, original against fused (``absorbed``: the second
    references of a half-precision model, :func:`egfuse.validate.fill_decided`)."""
    how = {"where_defined": where_defined, "finite_only": finite_only, "fill": fill, "copy_of_half": copy_of_half}
    absorbed = absorbed or {}

    def one(name: str) -> validate.Comparison:
        return validate.compare(
            name, expected[name], actual[name], reference.get(name), absorbed=absorbed.get(name), **how
        )

    judged = {key: r.output for key, r in entries.items() if r.output and r.output in expected and r.output in actual}
    regions = {key: one(name) for key, name in judged.items()}
    graph = [one(n) for n in outputs if n in actual]
    return regions, graph


def fused_entries(report: Report) -> dict[RegionKey, RegionReport | RotaryReport]:
    """What validation judges, by the key it rolls back by."""
    entries: dict[RegionKey, RegionReport | RotaryReport] = {r.index: r for r in report.regions if r.status == "fused"}
    entries.update({("rotary", r.index): r for r in report.rotary if r.status == "fused"})
    entries.update({("layer", r.index): r for r in report.layer_ops if r.status == "fused"})
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


FLOAT32_COPIES_NOTE = (
    "validated on float32 copies of both models: onnxruntime's CPU provider has no bfloat16 kernels for this model, "
    "so what each fused region computes is checked, and bfloat16's own rounding (the kernel's) is not"
)


def _float32_copies(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    feeds: dict | None,
    weights: protos.DetachedWeights | None,
    err: Exception,
) -> tuple[onnx.ModelProto, onnx.ModelProto, dict | None] | None:
    """Float32 copies of both models (and the feeds) where onnxruntime refused a bfloat16 original for want of
    kernels — its CPU provider runs few bfloat16 ops, the GPUs that run such models do. bfloat16 has float32's
    exponent range, so the copies keep what the masks' fills and every overflow mean, and only the rounding
    is the kernel's. None for any other failure, for a model without bfloat16 values, and for a model past
    protobuf's limit (the copies would cost its weights twice more)."""
    if not _does_not_load(err) or not _holds_bfloat16(original) or (weights is not None and weights.large):
        return None
    wide_original, wide_fused = _widened_copies(original, fused, weights)
    return wide_original, wide_fused, validate.upcast_feeds(feeds, fills=True) if feeds is not None else None


def _widened_copies(
    original: onnx.ModelProto, fused: onnx.ModelProto, weights: protos.DetachedWeights | None
) -> list[onnx.ModelProto]:
    """Float32 copies of both models, their weights put back, a half type's fills kept at float32's ends."""
    wide = []
    for model in (original, fused):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        wide.append(validate.upcast(weights.restore(copy) if weights is not None else copy, fills=True))
    return wide


def _holds_bfloat16(model: onnx.ModelProto) -> bool:
    graph = model.graph
    infos = [*graph.input, *graph.output, *graph.value_info]
    return any(v.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16 for v in infos) or any(
        t.data_type == onnx.TensorProto.BFLOAT16 for t in graph.initializer
    )


def _does_not_load(err: Exception) -> bool:
    """onnxruntime refused the graph when making the session (an op it has no kernel for, an invalid graph),
    not the inputs when running it."""
    text = str(err)
    return any(
        sign in text for sign in ("Load model", "NOT_IMPLEMENTED", "INVALID_GRAPH", "Could not find an implementation")
    )
