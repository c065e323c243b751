"""Half-precision outputs judged row by row: against a float32 evaluation of the original, as close as the
original's own rounding allows, and only finite where a fill's rounding — not the model — decides the answer.

float16 and bfloat16 round every intermediate, and a fused kernel rounds differently from the graph's ops, so
no fixed tolerance tells a fault from rounding; the original's own error, row by row, is the yardstick. Apart
from :mod:`egfuse.validation.validate`, which picks the judgment an output gets and judges float32 ones.
"""

from __future__ import annotations

import numpy as np

from egfuse.validation.row_diffs import max_diff, per_row, row_ulps

HALF_ULPS = 8
"""float16/bfloat16 outputs with a float32 reference: the fused op may be off it by twice the original's
own error plus this many ulps of the output's magnitude. It rounds its intermediates differently from the
unfused graph (the scale applied once instead of to Q and K, say), which costs a few ulps on its own."""

ROUNDING_ULPS = 64
"""A half-precision row (the last axis: one query position's output) that the original itself misses its
float32 evaluation by more than this many ulps is a row whose answer is the rounding of its scores against a
finite fill — every key it may see hidden (padding on the left under a causal mask makes them in any feeds,
not only those built to). No kernel is bound to reproduce that rounding (onnxruntime's float16 ``Attention``
computes the masked softmax in float32), so such a row need only be finite where the original's row is. The
other rows are judged against the original's precision on them alone: a fault in an ordinary row cannot hide
behind another row's rounding."""


def finite_where_original_is(expected: np.ndarray, actual: np.ndarray) -> bool:
    """A half-precision output on feeds that mask whole rows: each row finite wherever the original's is."""
    finite = np.isfinite(actual) | ~np.isfinite(expected)
    return bool(np.all(per_row(finite) | ~per_row(np.isfinite(expected))))


def against_reference(
    expected: np.ndarray,
    actual: np.ndarray,
    reference: np.ndarray,
    absorbed: np.ndarray | None,
    precision: np.dtype | None = None,
) -> tuple[float, bool]:
    """A half-precision output against its float32 ``reference``: the rows the fill's rounding decides need
    only be finite, every other row as close as the original's own error allows. Returns the largest
    difference over the rows judged for closeness, and whether the output passes. ``precision``: the half type
    the rounding is counted in, where it is not the output's own (a float32 value of a float16 model, computed
    from float16 ones: an RMS norm between two Casts carries its input's rounding, 1e-3 of each row)."""
    precision = precision or expected.dtype
    diff = max_diff(expected, actual)[1]
    finite = np.isfinite(actual) | ~np.isfinite(expected)
    own = per_row(max_diff(reference, expected)[1])
    rounding = (own > ROUNDING_ULPS * row_ulps(precision, reference)) | fill_decided(precision, reference, absorbed)
    close = _as_close_as_original(expected, actual, reference, ~rounding, precision)
    judged = per_row(diff)[~rounding]  # the difference reported: over the rows judged for closeness
    return float(judged.max()) if judged.size else 0.0, bool(np.all(close | (rounding & per_row(finite))))


def fill_decided(dtype: np.dtype, reference: np.ndarray, absorbed: np.ndarray | None) -> np.ndarray:
    """The rows of a half-precision output whose value the fill's rounding decides, not the model: those where
    its two float32 references disagree — ``reference`` with the fills at their half-precision value (−65504
    is finite in float32 and keeps the scores under it: a fully masked row is their softmax) and ``absorbed``
    with them at the end of float32's range (the scores vanish under it: the row is uniform, the mean of V).
    In half precision ``S + finfo.min`` is finfo.min for |S| < 16 — the second answer — unless the kernel adds
    in float32 (onnxruntime's CPU provider inserts casts around the ops it has no float16 kernel for) — the
    first. Both are a correct float16 program; a row they disagree on is a row every key of which is masked
    (or one downstream of it), and there only finiteness is asked, as on the mask-exercising feeds, where the
    float32 copies judge what the mask means (:mod:`egfuse.validation.judge`). Rows where the references agree are
    judged as before, so a fault in any ordinary row is still seen."""
    rows = per_row(np.zeros(reference.shape, dtype=bool))
    if absorbed is None or absorbed.shape != reference.shape:
        return rows
    apart = per_row(max_diff(reference, absorbed)[1])
    return apart > HALF_ULPS * row_ulps(dtype, reference)


def _as_close_as_original(
    expected: np.ndarray, actual: np.ndarray, reference: np.ndarray, peers: np.ndarray, precision: np.dtype
) -> np.ndarray:
    """Per row (last axis): ``actual`` no further from the wider ``reference`` than twice the
    original's worst error over the rows of its kind (``peers``), plus ``HALF_ULPS`` ulps of the row's
    magnitude. Rows are judged apart from the rows the original rounds against a fill: those excuse no error
    in an ordinary row."""
    own = per_row(max_diff(reference, expected)[1])
    ours = per_row(max_diff(reference, actual)[1])
    worst_own = float(own[peers].max()) if peers.any() else 0.0
    return peers & (ours <= 2.0 * worst_own + HALF_ULPS * row_ulps(precision, reference))
