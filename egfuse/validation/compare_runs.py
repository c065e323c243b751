"""Both models on one feed set, compared output by output: each fused region's own output and each graph output.

Apart from :mod:`egfuse.validation.judge`, which decides what the comparisons mean for the report and what to roll back:
here only how one run is judged — a wider reference of the original (float64; for half precision float32, twice:
fills kept at their value and kept absorbing) is run only where a plain comparison fails, since each costs a
run of a widened copy, and a half-precision model on mask-exercising feeds is judged again on float32 copies
(:func:`_compare_widened`), where a fully masked row has one answer.
"""

from __future__ import annotations

import numpy as np
import onnx

from egfuse.files import protos
from egfuse.report import RegionKey
from egfuse.validation import memory, validate
from egfuse.validation.float32_copies import widened_copies


def compare_on(
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
    outputs_of_half: bool = False,
) -> dict | None:
    """Both models on ``data``: the failing regions (key → max diff) and the graph outputs' comparisons; None
    where the original does not run on them. ``float32_copies``: a half-precision model judged for finiteness
    is also judged on float32 copies of both (:func:`_compare_widened`). ``outputs_of_half``: the models are
    float32 copies of a bfloat16 one, whose graph outputs are held to its precision (:func:`compared_outputs`)."""
    try:
        expected = validate.run(original, data, names, weights=weights)
    except Exception:
        return None
    try:
        actual = validate.run(fused, data, names, weights=weights)
    except Exception:
        return {"regions": dict.fromkeys(entries, float("inf")), "outputs": []}
    how = {"finite_only": finite_only, "copies": copies, "outputs_of_half": outputs_of_half}
    regions, compared = compared_outputs(
        original, data, expected, actual, names, entries, outputs, weights, budget, where_defined=True, **how
    )
    failing = {key: c.max_abs_diff for key, c in regions.items() if not c.ok}
    if finite_only and float32_copies and _half(expected):
        wide = _compare_widened(original, fused, data, names, outputs, entries, weights, budget)
        for key, diff in wide["regions"].items():
            failing.setdefault(key, diff)
        compared.extend(wide["outputs"])
    return {"regions": failing, "outputs": compared}


def _half(outputs: dict) -> bool:
    return _half_type(outputs) is not None


def _half_type(outputs: dict) -> np.dtype | None:
    """The half type a model computes in, read off its outputs (None: no half-precision output)."""
    halves = [v.dtype for v in outputs.values() if np.issubdtype(v.dtype, np.floating) and np.finfo(v.dtype).bits <= 16]
    return min(halves, key=lambda dtype: np.finfo(dtype).nmant) if halves else None


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
    wide = widened_copies(original, fused, weights)
    data = validate.upcast_feeds(data, fills=True)
    try:
        memory.check(wide[0], data, budget, weights_mapped=False)
    except memory.OverBudget:
        return nothing
    return compare_on(wide[0], wide[1], data, names, outputs, entries, None, budget=budget, copies=True) or nothing


def compared_outputs(
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
    *,
    outputs_of_half: bool = False,
) -> tuple[dict[RegionKey, validate.Comparison], list[validate.Comparison]]:
    """The comparisons on one feed set (``copies``: float32 copies of a half-precision model, see
    :func:`egfuse.validation.validate.compare`'s ``copy_of_half``); where one fails, judged again against a float64 run
    of the original (only then: it costs a run of a widened copy) — a row a finite fill hides entirely is
    decided by rounding. ``outputs_of_half``: float32 copies of a bfloat16 model, whose graph outputs are held
    to ``copy_of_half``'s tolerance, the model's own precision: its constants are stored rounded to bfloat16
    (GELU's √(2/π) is 0.796875 there), and a fused op computes with the exact ones — 1e-4 of a float32 copy's
    output after two layers, an eightieth of a bfloat16 ulp. Each region's own output stays at float32's
    tolerance, where a fault in it is seen."""
    how = {"where_defined": where_defined, "finite_only": finite_only, "copy_of_half": copies}
    how["outputs_of_half"] = outputs_of_half
    how["precision"] = _half_type(expected)  # float32 values of a half model judged at its precision
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
    precision: np.dtype | None = None,
    outputs_of_half: bool = False,
) -> tuple[dict[RegionKey, validate.Comparison], list[validate.Comparison]]:
    """Each fused entry's output and each graph output, original against fused (``absorbed``: the second
    references of a half-precision model, :func:`egfuse.validation.validate.fill_decided`)."""
    how = {"where_defined": where_defined, "finite_only": finite_only, "fill": fill, "copy_of_half": copy_of_half}
    how["precision"] = precision
    absorbed = absorbed or {}

    def one(name: str, **overrides: object) -> validate.Comparison:
        settings = {**how, **overrides}
        return validate.compare(name, expected[name], actual[name], reference.get(name), absorbed=absorbed.get(name),
                                **settings)  # fmt: skip

    judged = {key: r.output for key, r in entries.items() if r.output and r.output in expected and r.output in actual}
    regions = {key: one(name) for key, name in judged.items()}
    graph = [one(n, copy_of_half=copy_of_half or outputs_of_half) for n in outputs if n in actual]
    return regions, graph
