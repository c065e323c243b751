"""Judge: run the original and the fused model on onnxruntime and decide what stays.

Graph outputs and every fused region's and rotation's own output are compared; a region that differs is rolled
back (or, where its e-class held another fused form the target can write, tried again with that form banned).
A region downstream of one that differs differs too, so the upstream ones go first (:func:`upstream_only`).
"""

from __future__ import annotations

import onnx

from egfuse import protos, validate
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
) -> dict[RegionKey, tuple[str, float]]:
    """Compare graph outputs and every fused region's and rotation's output; return what to roll back."""
    entries = fused_entries(report)
    names = [r.output for r in entries.values() if r.output]
    try:
        data, expected = validate.original_outputs(original, feeds, names, weights=weights)
    except Exception as err:
        # Unproven is not proven: keep the original regions, and say how to give real inputs.
        report.validated = None
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
    reference = validate.references(original, data, expected, names, weights=weights)
    outputs = [o.name for o in original.graph.output]
    regions, cmps = _comparisons(expected, actual, reference, entries, outputs, where_defined=False)
    failing: dict[RegionKey, tuple[str, float]] = {}
    for key, cmp in regions.items():
        entries[key].max_abs_diff = cmp.max_abs_diff
        if not cmp.ok:
            failing[key] = (f"outputs differ from the original by {cmp.max_abs_diff:.3g}", cmp.max_abs_diff)
    # Generated feeds: the masks exercised too (the user's feeds are what the model runs on). A model past
    # protobuf's limit (``weights``) is run once: each further run of a multi-GB model costs its size again.
    if feeds is None and weights is None:
        for label, masked in validate.mask_feed_sets(data).items():
            more = _compare_on(original, fused, masked, names, outputs, entries, weights)
            if more is None:
                continue  # the original does not run on these: they say nothing
            for key, diff in more["regions"].items():
                if key not in failing:
                    failing[key] = (f"outputs differ from the original by {diff:.3g} on {label} feeds", diff)
            cmps.extend(more["outputs"])
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
) -> dict | None:
    """Both models on ``data``: the failing regions (key → max diff) and the graph outputs' comparisons; None
    where the original does not run on them."""
    try:
        expected = validate.run(original, data, names, weights=weights)
    except Exception:
        return None
    try:
        actual = validate.run(fused, data, names, weights=weights)
    except Exception:
        return {"regions": dict.fromkeys(entries, float("inf")), "outputs": []}
    reference = validate.references(original, data, expected, names, weights=weights)
    regions, compared = _comparisons(expected, actual, reference, entries, outputs, where_defined=True)
    return {"regions": {key: c.max_abs_diff for key, c in regions.items() if not c.ok}, "outputs": compared}


def _comparisons(
    expected: dict, actual: dict, reference: dict, entries: dict, outputs: list[str], *, where_defined: bool
) -> tuple[dict[RegionKey, validate.Comparison], list[validate.Comparison]]:
    """Each fused entry's output and each graph output, original against fused."""
    regions = {
        key: validate.compare(
            r.output, expected[r.output], actual[r.output], reference.get(r.output), where_defined=where_defined
        )
        for key, r in entries.items()
        if r.output and r.output in expected and r.output in actual
    }
    graph = [
        validate.compare(n, expected[n], actual[n], reference.get(n), where_defined=where_defined)
        for n in outputs
        if n in actual
    ]
    return regions, graph


def fused_entries(report: Report) -> dict[RegionKey, RegionReport | RotaryReport]:
    """What validation judges, by the key it rolls back by."""
    entries: dict[RegionKey, RegionReport | RotaryReport] = {r.index: r for r in report.regions if r.status == "fused"}
    entries.update({("rotary", r.index): r for r in report.rotary if r.status == "fused"})
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
