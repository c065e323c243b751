"""A finite select fill read as a mask, checked against the scores validation's feeds make.

``softmax(Where(m, S, F))`` with a finite fill (F = −1e4, −1e9) hides the keys it replaces only while the row
keeps a key scoring well above F; on a row whose kept keys all score below F the graph hands the row to the
masked keys. A fused op adds its mask to the scores, so no mask it can be given computes both that and a
fully masked row (uniform in the graph): egfuse writes F scaled until it absorbs every score, exact on the
fully masked row, and assumes the scores keep clear of F. Validation cannot try every input, so it measures
how close they come: on its largest feeds (the large-scores set, whose meaning it judges) a score below
F·:data:`REACH` that is not the fill itself puts such a row within reach of inputs no larger than those,
and the region goes back to the graph's own ops."""

from __future__ import annotations

import numpy as np
import onnx

from egfuse.files import protos
from egfuse.report import RegionReport
from egfuse.validation import inputs, validate

__all__ = ["REACH", "closest_score", "reached"]

REACH = 0.5
"""A kept score below this fraction of the fill counts as reaching it: half-way there on the largest feeds."""

FILL_ROUNDING = 1 / 64
"""How far from F (relative) an entry still counts as the fill: the graph's F plus a small bias, rounded in
float16 (ulp 8 at 1e4), is the fill, not a score."""


def closest_score(scores: np.ndarray, fill: float) -> float | None:
    """The lowest entry of the softmax input ``scores`` between 2F and F·:data:`REACH` that is not the fill
    (within :data:`FILL_ROUNDING` of F), None where there is none. Below 2F are the entries other masks hide
    (finfo.min, its half, −inf, and sums onto them)."""
    values = np.asarray(scores, dtype=np.float64)
    window = np.isfinite(values) & (values > 2 * fill) & (values < fill * REACH)
    window &= np.abs(values - fill) > abs(fill) * FILL_ROUNDING
    return float(values[window].min()) if window.any() else None


def reached(
    original: onnx.ModelProto,
    data: dict[str, np.ndarray],
    entries: dict,
    weights: protos.DetachedWeights | None,
) -> dict:
    """The regions among ``entries`` whose assumed fill (:attr:`RegionReport.assumed_fill`) the scores reach
    on validation's largest feeds (the large-scores set built from ``data``, or ``data`` itself for a model
    without one): key → (reason, distance). One run of the original, only for a model with such a region."""
    assumed = {key: r for key, r in entries.items() if isinstance(r, RegionReport) and r.assumed_fill is not None}
    softmax_input = {n.name: n.input[0] for n in original.graph.node if n.op_type == "Softmax" and n.name}
    names = {key: softmax_input[r.softmax] for key, r in assumed.items() if r.softmax in softmax_input}
    if not names:
        return {}
    label, feeds = "the base", data
    larger = inputs.mask_feed_sets(data).get(inputs.LARGE_SCORES)
    if larger is not None:
        label, feeds = f"{inputs.LARGE_SCORES}", larger
    try:
        scores = validate.run(original, feeds, sorted(set(names.values())), weights=weights)
    except Exception:  # the original does not run on them: they say nothing
        return {}
    found = {}
    for key, name in names.items():
        fill = float(assumed[key].assumed_fill)
        closest = closest_score(scores[name], fill)
        if closest is not None:
            reason = (
                f"the scores reach the mask's fill {fill:g} (a kept score of {closest:.3g} on {label} feeds): "
                "a row whose keys all score below it goes to the masked keys in the graph, not in the fused op"
            )
            found[key] = (reason, abs(closest - fill))
    return found
