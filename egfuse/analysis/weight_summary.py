"""What the facts ask of a stored tensor's values (finite? how large? a RoPE table with repeated halves?), read in
one pass of row chunks: a weight mapped from its file is never copied whole, and is unmapped again after, so the
search holds no second copy of a large model's weights."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_ir as ir


@dataclass(frozen=True)
class Summary:
    """What the facts ask of a stored tensor's values, read in one pass: all finite, the largest finite
    magnitude (0 for none), the largest magnitude (None where some element is not finite), whether its two
    halves along the last axis are equal (a RoPE table stored with its halves repeated)."""

    finite: bool
    finite_bound: float | None
    bound: float | None
    halves_repeat: bool
    pairs_repeat: bool = False
    """Each even element along the last axis equals the next, and not every element is the same: a RoPE table
    stored (or folded, in a static-shape export) with each entry twice in pairs, ``repeat_interleave(t, 2)``."""


_CHUNK_ELEMENTS = 1 << 22
"""Rows read at a time when summarising a stored tensor: its temporaries stay a few MB whatever its size."""


_NON_NUMERIC = Summary(finite=False, finite_bound=None, bound=None, halves_repeat=False)
"""A string or other non-numeric constant: nothing is known of its values."""


def summarize(array: np.ndarray) -> Summary:
    """``array``'s :class:`Summary`, read in chunks of rows: a weight mapped from a file is never copied whole
    (``np.abs`` of a 2 GB projection would be another 2 GB)."""
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == ml_dtypes.bfloat16):
        return _NON_NUMERIC
    rows = array.reshape(-1, array.shape[-1]) if array.ndim >= 1 and array.size else array.reshape(1, -1)
    half = rows.shape[1] // 2 if rows.shape[1] % 2 == 0 and rows.shape[1] > 0 else 0
    step = max(1, _CHUNK_ELEMENTS // max(1, rows.shape[1]))
    floating = np.issubdtype(array.dtype, np.floating) or array.dtype == ml_dtypes.bfloat16
    finite, largest, halves = True, 0.0, bool(half) and floating
    pairs, first, varies = bool(half) and floating and array.ndim >= 2, None, False
    for start in range(0, rows.shape[0], step):
        chunk = np.asarray(rows[start : start + step], np.float64)
        mask = np.isfinite(chunk)
        finite = finite and bool(mask.all())
        if mask.any():
            largest = max(largest, float(np.max(np.abs(chunk[mask]))))
        halves = halves and bool(np.array_equal(chunk[:, :half], chunk[:, half:]))
        pairs = pairs and bool(np.array_equal(chunk[:, 0::2], chunk[:, 1::2]))
        if pairs and not varies and chunk.size:
            first = chunk.flat[0] if first is None else first
            varies = bool(np.any(chunk != first))
        del chunk, mask
    return Summary(finite, largest, largest if finite else None, halves, pairs and varies)


def release(value: ir.Value) -> None:
    """Unmap ``value``'s data if it was mapped from a file (read again, mapped again, on the next use)."""
    node = value.producer()
    while node is not None and node.op_type in ("Identity", "Transpose") and node.inputs:
        value, node = node.inputs[0], node.inputs[0].producer()
    if isinstance(value.const_value, ir.ExternalTensor):
        with contextlib.suppress(BufferError):  # a view of it is still held somewhere: it stays mapped
            value.const_value.release()
