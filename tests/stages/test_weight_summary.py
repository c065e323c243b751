"""``weight_summary.summarize``: what the facts ask of a stored tensor, read in chunks of rows so a weight mapped
from a file is never copied whole — the same answers as reading it whole, on finite, non-finite, bfloat16 and
repeated-halves tensors, across chunk boundaries."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from egfuse.analysis import weight_summary


def _whole(array: np.ndarray) -> tuple[bool, float, bool]:
    values = np.asarray(array, np.float64)
    finite = values[np.isfinite(values)]
    half = array.shape[-1] // 2
    return (
        bool(np.isfinite(values).all()),
        float(np.abs(finite).max()) if finite.size else 0.0,
        bool(np.array_equal(values[..., :half], values[..., half:])),
    )


@pytest.mark.parametrize("chunk", [1, 7, 1 << 22])
@pytest.mark.parametrize("case", ["finite", "inf", "nan", "halves", "bfloat16", "rank3"])
def test_a_chunked_summary_is_the_whole_one(case, chunk, monkeypatch):
    monkeypatch.setattr(weight_summary, "_CHUNK_ELEMENTS", chunk)
    rng = np.random.default_rng(0)
    array = rng.standard_normal((13, 6)).astype(np.float32)
    if case == "inf":
        array[11, 2] = -np.inf  # in the last chunk of every size
    if case == "nan":
        array[0, 5] = np.nan
    if case == "halves":
        array[:, 3:] = array[:, :3]
    if case == "bfloat16":
        array = array.astype(ml_dtypes.bfloat16)
    if case == "rank3":
        array = array.reshape(13, 2, 3)
    summary = weight_summary.summarize(array)
    finite, largest, halves = _whole(array)
    assert (summary.finite, summary.finite_bound, summary.halves_repeat) == (finite, largest, halves)
    assert summary.bound == (largest if finite else None)


def test_a_nearly_repeated_table_is_not_repeated():
    array = np.tile(np.arange(4, dtype=np.float32), (9, 2))
    array[8, 6] += 1e-3  # one element of the last row's second half
    assert not weight_summary.summarize(array).halves_repeat
    assert weight_summary.summarize(np.tile(np.arange(4, dtype=np.float32), (9, 2))).halves_repeat
