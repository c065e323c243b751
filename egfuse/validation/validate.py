"""Numerical proof on onnxruntime: the fused model against the original, on generated feeds.

Runs go through :mod:`~egfuse.validation.runner`, wider references through :mod:`~egfuse.validation.widen`; feeds come
from :mod:`~egfuse.validation.inputs` (or the user). Region outputs keep their names through fusion, so one run compares
every region separately and a failing region can be rolled back alone. This module judges: tolerances and the
comparison of one output (half-precision outputs row by row in :mod:`~egfuse.validation.half_compare`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from egfuse.validation.half_compare import (
    HALF_ULPS,
    ROUNDING_ULPS,
    against_reference,
    fill_decided,
    finite_where_original_is,
)
from egfuse.validation.inputs import make_feeds, mask_feed_sets
from egfuse.validation.row_diffs import max_diff, per_row, row_ulps
from egfuse.validation.runner import ATOL, DEFAULTS, RTOL, Settings, available, current, original_outputs, run, using
from egfuse.validation.widen import largest_fill, references, upcast, upcast_feeds

__all__ = [
    "ATOL",
    "DEFAULTS",
    "HALF_ULPS",
    "ROUNDING_ULPS",
    "RTOL",
    "Comparison",
    "Settings",
    "available",
    "compare",
    "compare_models",
    "current",
    "fill_decided",
    "largest_fill",
    "make_feeds",
    "mask_feed_sets",
    "original_outputs",
    "reference_unread",
    "references",
    "run",
    "upcast",
    "upcast_feeds",
    "using",
]

HALF_TOLERANCE = 1e-2
"""float16/bfloat16 outputs without a float32 reference: ~10 ulps of float16 (absolute and relative)."""
FILL_ROUNDING_FACTOR = 4.0
"""A float32 row whose every key a finite fill hides (−1e6): the original rounds each score once against the
fill (to its ulp, 1/16); a fused op that adds the other biases to the fill first rounds twice, so its error may
reach twice the original's worst — and the original's observed error is below its worst. A row the fused op
changes (zeroed, uniform instead of the scores' softmax) is off by the values themselves, far more."""

FILL_ULP_CAP = 2.0**-4
"""The largest fill ulp (that of 1e6 in float32) that excuses an error in a fill-rounded row: past it the fill
absorbs the scores rather than rounds them (finfo.min, −1e9), both programs give that row one answer, and a
kernel's 0 in place of the graph's uniform average must still be seen."""


@dataclass
class Comparison:
    name: str
    max_abs_diff: float
    ok: bool


def reference_unread(outputs: dict[str, np.ndarray], finite_only: bool) -> bool:
    """Whether :func:`compare` reads no reference for any of ``outputs``: with ``finite_only`` every float
    output in half precision is judged for finiteness alone, so the reference run can be skipped."""
    floats = [v for v in outputs.values() if np.issubdtype(v.dtype, np.floating)]
    return finite_only and bool(floats) and all(np.finfo(v.dtype).bits <= 16 for v in floats)


def compare(
    name: str,
    expected: np.ndarray,
    actual: np.ndarray,
    reference: np.ndarray | None = None,
    *,
    where_defined: bool = False,
    finite_only: bool = False,
    fill: float = 0.0,
    copy_of_half: bool = False,
    absorbed: np.ndarray | None = None,
    precision: np.dtype | None = None,
) -> Comparison:
    """Float32 outputs must agree to ``atol + rtol·|expected|`` (:class:`Settings`: 1e-4 and 1e-3 by
    default). Half-precision outputs with a float32 ``reference`` must be, row by row, no further from it than
    twice the original's own error in that row plus ``HALF_ULPS`` ulps (a row where the original itself is off
    by more than ``ROUNDING_ULPS`` ulps need only be finite); without one, ``HALF_TOLERANCE`` applies. NaN
    must meet NaN — except, with ``where_defined``, where the original itself gives NaN (a query row whose
    keys a −inf mask hides entirely: the mask-exercising feeds make such rows, and the original defines
    nothing there). With ``finite_only`` (the feeds that mask every key of a row), a half-precision output need
    only be finite in the rows where the original's is (the row's value is the fill's rounding,
    :func:`egfuse.validation.inputs.mask_feed_sets`): a row the original computes finite in some entries and not in
    others is one where its own arithmetic left the type's range (scores past 65504 on a large-scores
    redraw), and which of its entries survive is the luck of its rounding, nothing a fused op is held to.
    A float32 output that misses the tolerance passes when a float64 ``reference`` is given and each row that
    misses it is within the tolerance of that reference, or no
    further from it than ``FILL_ROUNDING_FACTOR`` times the original's error — in that row, or its worst
    in a row it itself misses the reference by more than the tolerance (how lucky the original's rounding was
    in one fill-rounded row is noise; an error below four times the fill's rounding cannot be told from it,
    and a fault — a mask dropped, a scale wrong — is far larger); in a row the original misses by more than
    ``ROUNDING_ULPS`` ulps, also no further than four times the ulp of the mask's ``fill``
    (:func:`egfuse.validation.widen.largest_fill`, at most ``FILL_ULP_CAP``) times the row's magnitude — what rounding
    each score against the fill may cost, however lucky the original was there: a query row whose every
    key a finite fill hides (−1e4, −1e6: left padding under a causal mask makes them) has its scores rounded
    to the fill's ulp, so there the original is itself off the exact answer by as much as a fused op may be.
    Zero tolerances (``--atol 0 --rtol 0``) ask for the original's own bits, so they get no such rescue.
    ``copy_of_half``: float32 copies of a half-precision model, compared to judge what its masks mean, are held to
    ``HALF_TOLERANCE`` — the precision the model itself has, relative to each row's largest entry (an entry of
    ``P·V`` carries the rounding of the whole row's weights: under large scores a fused kernel's float32 sum
    is 1e-3 of the row off a float64 evaluation where the primitive ops' is 1e-6, and a small entry of that
    row is no more exact than its large ones): a kernel's own float32 approximations (onnxruntime's
    soft-capped ``Attention``, 1e-4 off a float64 evaluation) are not the question there, a meaning changed is
    (0 for the mean of V in a fully masked row is off by the values themselves).
    ``absorbed``: a half-precision output's second float32 reference, with the fills kept absorbing
    (:func:`fill_decided`); a row the two references disagree on need only be finite.
    ``precision``: the half type a half-precision model computes in. Its float32 values (an RMS norm between two
    Casts, a softmax in float32) are computed from half-precision ones and carry their rounding — one float16
    ulp of a norm's input is 1e-3 of its output, the float32 tolerance — so one that misses the float32
    tolerance is judged as a half-precision output is, in ``precision``'s ulps, against the float32 (or
    float64) ``reference``: as close as the original's own error allows, only finite in a row a fill decides."""
    if where_defined:
        actual, reference = _undefined_agreed(expected, actual, reference)
    if expected.shape != actual.shape:
        return Comparison(name, float("inf"), False)
    if not np.issubdtype(expected.dtype, np.floating):
        same = bool(np.array_equal(expected, actual))
        return Comparison(name, 0.0 if same else float("inf"), same)
    half = np.finfo(expected.dtype).bits <= 16
    if half and finite_only:  # only finiteness asked: no closeness to report, a non-finite value is infinitely off
        ok = finite_where_original_is(expected, actual)
        return Comparison(name, 0.0 if ok else float("inf"), ok)
    if half and reference is not None and reference.shape == expected.shape:
        return Comparison(name, *against_reference(expected, actual, reference, absorbed))
    plain = _within_tolerance(name, expected, actual, reference, half=half, fill=fill, copy_of_half=copy_of_half)
    widened = reference is not None and reference.shape == expected.shape and np.finfo(reference.dtype).bits >= 32
    if plain.ok or half or precision is None or not widened:
        return plain
    return Comparison(name, *against_reference(expected, actual, reference, absorbed, precision))


def _undefined_agreed(
    expected: np.ndarray, actual: np.ndarray, reference: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """``actual`` (and ``reference``) given the original's NaN wherever the original has one: what the
    original leaves undefined (a query row a −inf mask hides entirely) asks nothing of the fused op."""
    if np.issubdtype(expected.dtype, np.floating) and expected.shape == actual.shape:
        undefined = np.isnan(expected)
        if undefined.any():
            actual = np.where(undefined, expected, actual)
            if reference is not None and reference.shape == expected.shape:
                reference = np.where(undefined, expected.astype(reference.dtype), reference)
    return actual, reference


def _within_tolerance(
    name: str,
    expected: np.ndarray,
    actual: np.ndarray,
    reference: np.ndarray | None,
    *,
    half: bool,
    fill: float,
    copy_of_half: bool,
) -> Comparison:
    """``atol + rtol·|expected|`` elementwise; a miss may still be rescued row by row by a float64
    ``reference`` (:func:`_rescued_by_float64`) unless the user asked for the original's bits."""
    worst, diff = max_diff(expected, actual)
    settings = current()
    atol, rtol = (HALF_TOLERANCE, HALF_TOLERANCE) if half or copy_of_half else (settings.atol, settings.rtol)
    magnitude = np.nan_to_num(np.abs(expected.astype(np.float64)), posinf=0.0)
    if copy_of_half and magnitude.ndim and magnitude.shape[-1]:  # an entry of P·V errs by its row's scale
        magnitude = np.broadcast_to(per_row(magnitude).reshape(*magnitude.shape[:-1], 1), magnitude.shape)
    within = diff <= atol + rtol * magnitude
    ok = bool(np.all(within))
    exact = settings.atol == 0.0 and settings.rtol == 0.0  # the user asked for the original's bits: no rescue
    widened = reference is not None and reference.dtype == np.float64 and reference.shape == expected.shape
    if not ok and not exact and widened:
        ok = _rescued_by_float64(expected, actual, reference, within, atol, rtol, fill)
    return Comparison(name, worst, ok)


def _rescued_by_float64(
    expected: np.ndarray,
    actual: np.ndarray,
    reference: np.ndarray,
    within: np.ndarray,
    atol: float,
    rtol: float,
    fill: float,
) -> bool:
    """Every row that misses the tolerance is within it of the float64 ``reference``, or no further from it
    than ``FILL_ROUNDING_FACTOR`` times the original's own error (and, in a row rounded against a finite fill,
    than that factor times the fill's ulp): see :func:`compare`."""
    tolerance = atol + rtol * np.nan_to_num(np.abs(reference), posinf=0.0)
    own, ours = max_diff(reference, expected)[1], max_diff(reference, actual)[1]
    rounding = ~per_row(own <= tolerance)  # rows the original itself misses the exact answer in
    own = per_row(own)
    worst_rounding = own[rounding].max() if rounding.any() else 0.0  # the output's worst rounding against a fill
    bound = FILL_ROUNDING_FACTOR * np.maximum(own, worst_rounding)
    if fill_ulp := _fill_ulp(expected.dtype, fill):
        rounded = own > ROUNDING_ULPS * row_ulps(expected.dtype, reference)  # rows rounded against the fill
        magnitude = per_row(np.nan_to_num(np.abs(reference), nan=0.0, posinf=0.0))
        excused = FILL_ROUNDING_FACTOR * fill_ulp * np.maximum(1.0, magnitude)
        bound = np.where(rounded, np.maximum(bound, excused), bound)
    return bool(np.all(per_row(within) | per_row(ours <= tolerance) | (per_row(ours) <= bound)))


def _fill_ulp(dtype: np.dtype, fill: float) -> float:
    """One ulp of ``dtype`` at the fill's magnitude, at most ``FILL_ULP_CAP``; 0 without a fill."""
    if not fill > 0.0:
        return 0.0
    with np.errstate(over="ignore"):
        spacing = float(np.spacing(np.abs(dtype.type(fill))))
    return min(spacing, FILL_ULP_CAP) if np.isfinite(spacing) else FILL_ULP_CAP


def compare_models(
    original: onnx.ModelProto, fused: onnx.ModelProto, feeds: dict[str, np.ndarray], names: list[str] | None = None
) -> dict[str, Comparison]:
    """Every graph output (and the named intermediate values) of both models, compared as above."""
    expected = run(original, feeds, names)
    actual = run(fused, feeds, names)
    reference = references(original, feeds, expected, names or [])
    fill = largest_fill(original, feeds)
    return {n: compare(n, e, actual[n], reference.get(n), fill=fill) for n, e in expected.items() if n in actual}
