"""The numbers a mask's fills are written as: finfo.min moved one ulp up (or halved in half precision) where a
kernel would read it as −inf, finite select fills scaled by a power of two until they absorb the scores.

Pure functions of a fill and a float type, kept apart from the writer (:mod:`egfuse.writing.raise_masks`) so the
arithmetic a fused op's correctness rests on reads, and is tested, on its own.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from egfuse.rules.masks import ABSORBING_FILL, MASK_FILL_MAX

HALF_LOWEST = frozenset({float(np.finfo(np.float16).min)})
"""float16's finfo.min: in float32 a fill that absorbs any score only at float32's own finfo.min."""
LOWEST = frozenset(float(ml_dtypes.finfo(t).min) for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64))
"""finfo.min of each float type, as the f64 a fill is kept as in the e-graph."""


def float_info(dtype: np.dtype) -> ml_dtypes.finfo | None:
    """The float type's limits (bfloat16's too: numpy's own ``finfo`` and ``issubdtype`` do not know it as a
    float), None for any other type."""
    try:
        return ml_dtypes.finfo(dtype)
    except (TypeError, ValueError):
        return None


def absorbing_scale(fills: list[float], terms: int) -> float | None:
    """The power of two that takes the smallest finite select fill of a mask to at least 1e30 in magnitude
    (float32: ``S + F`` then rounds to F for |S| < 2^75), or None where there is nothing to scale or it is
    not a mask: a fill above −1e4, or a factor that could make ``terms`` of them overflow. Zeros and fills
    that already absorb (−inf, finfo.min, ≤ −1e30) are left out: they keep their values, and compare with
    the scaled fills as with the originals (finfo.min still absorbs them)."""
    finite = [f for f in fills if scalable(f)]
    if not finite or any(0.0 > f > MASK_FILL_MAX or f > 0.0 for f in fills):
        return None
    smallest, largest = min(-f for f in finite), max(-f for f in finite)
    scale = 2.0 ** int(np.ceil(np.log2(-ABSORBING_FILL / smallest)))
    return scale if largest * scale * max(terms, 1) < 1e37 else None


def scalable(fill: float) -> bool:
    """A finite mask fill that does not absorb the scores: one :func:`absorbing_scale` scales."""
    return bool(np.isfinite(fill)) and ABSORBING_FILL < fill <= MASK_FILL_MAX


def mask_fill(fill: float, dtype: np.dtype, scale: float = 1.0) -> float:
    """The number to write for a select mask's fill so every kernel computes what the graph did.

    onnxruntime's standard ``Attention`` reads a mask entry equal to ``lowest`` (finfo.min) as −inf and gives 0
    for a query row masked entirely that way, where the primitive ops give the mean of V. One ulp above
    ``lowest`` means the same to the graph's algebra (added to any score it still rounds to the fill itself, so a
    fully masked row stays uniform) and to every kernel, so every target gets that — for a mask made of fills
    alone: next to another term that may hold ``lowest`` (a padding mask) the moved fill would break their tie,
    so the emitter writes the fill as it is there (:meth:`Emitter.mark_exact_fills`) and the standard op gets
    the whole mask moved instead (:meth:`Emitter.finite_mask`). ``scale``: the factor
    :meth:`MaskWriter.mark_exact_fills` gave a finite fill so it absorbs the scores (float32 and float64)."""
    if scale != 1.0 and dtype in (np.float32, np.float64):  # float16 holds no fill that absorbs float32 scores
        return float(dtype.type(fill * scale))
    info = float_info(dtype)
    if info is not None and fill == float(info.min):
        return moved_lowest(dtype)
    return fill


def moved_lowest(dtype: np.dtype) -> float:
    """What a mask entry of finfo.min is written as for a fused op: one ulp above it in float32 and float64
    (onnxruntime's standard ``Attention`` reads finfo.min itself as −inf); half of it in a half-precision type,
    where a kernel that adds the mask in that type overflows ``S + finfo.min`` to −inf once S < −16 (a query
    row whose every key is masked then gives NaN or 0 on large scores). At half the range a score must pass
    −32752 to overflow, a masked key still gets weight exp(−32752 − max) = 0, and two such fills summed stay
    finite. Widened for the float32 copies validation judges masks on, it is a fill again
    (:func:`egfuse.validation.widen.upcast`)."""
    info = float_info(dtype)
    lowest = info.min
    if info.bits <= 16:
        return float(dtype.type(float(lowest) / 2))
    return float(np.nextafter(lowest, dtype.type(0)))
