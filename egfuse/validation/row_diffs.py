"""Differences between two outputs, elementwise and row by row: the units validation's tolerances are stated in.

A row is the last axis — one query position's output in attention — because that is where a mask or a fill
changes what is computed: every judgment in :mod:`egfuse.validation.validate` and :mod:`egfuse.validation.half_compare`
is taken per row, so a fault in one row cannot hide behind another row's rounding.
"""

from __future__ import annotations

import numpy as np


def per_row(values: np.ndarray) -> np.ndarray:
    """The per-row maximum (or logical and) of an elementwise array over its last axis; a scalar is one row."""
    grid = values.reshape(1, 1) if values.ndim == 0 else values.reshape(-1, values.shape[-1])
    if grid.shape[1] == 0:
        return np.full(grid.shape[0], values.dtype == np.bool_, dtype=values.dtype)
    return grid.min(axis=1) if values.dtype == np.bool_ else grid.max(axis=1)


def row_ulps(dtype: np.dtype, reference: np.ndarray) -> np.ndarray:
    """One ulp of ``dtype`` at each row's magnitude (at least 1)."""
    magnitude = per_row(np.nan_to_num(np.abs(reference.astype(np.float64)), nan=0.0, posinf=0.0))
    return float(np.finfo(dtype).eps) * np.maximum(1.0, magnitude)


def max_diff(expected: np.ndarray, actual: np.ndarray) -> tuple[float, np.ndarray]:
    """The largest difference and the elementwise ones, in float64: NaN against NaN and the same inf differ by
    nothing, any other NaN by infinitely much."""
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.where((np.isnan(e) & np.isnan(a)) | (e == a), 0.0, np.abs(e - a))  # the same inf is no diff
    diff = np.where(np.isnan(diff), np.inf, diff)
    return (float(diff.max()) if diff.size else 0.0), diff
