"""How a half-precision output is judged where its own arithmetic decides the answer: a row the original
computes only partly finite (its scores left float16's range) and the float32 copies' row-scaled tolerance.
Each case checks that a correct output passes and that the fault the rule must still catch fails."""

from __future__ import annotations

import numpy as np

from egfuse.validation.validate import compare


def _rows(*rows: list[float]) -> np.ndarray:
    return np.array(rows, dtype=np.float16)


def test_a_row_the_original_overflowed_in_asks_nothing_of_the_fused_op():
    # row 0: the original kept two of four entries finite by the luck of its rounding (scores past 65504)
    expected = _rows([1.0, np.inf, np.nan, 2.0], [1.0, 2.0, 3.0, 4.0])
    actual = _rows([np.nan, np.nan, np.nan, np.nan], [1.5, 2.0, 3.0, 4.0])
    assert compare("y", expected, actual, finite_only=True).ok


def test_a_row_the_original_computes_finite_must_stay_finite():
    expected = _rows([1.0, np.inf, np.nan, 2.0], [1.0, 2.0, 3.0, 4.0])
    actual = _rows([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, np.inf, 4.0])
    result = compare("y", expected, actual, finite_only=True)
    assert not result.ok and result.max_abs_diff == float("inf")


def test_float32_copies_are_held_to_each_rows_scale():
    # a small entry of a row whose large entries are 25: an error of 2e-2 there is the row's rounding
    expected = np.array([[25.0, 0.1, -20.0], [1.0, 2.0, 3.0]], dtype=np.float32)
    rounded = expected + np.array([[0.01, 0.02, -0.01], [0.0, 0.0, 0.0]], dtype=np.float32)
    assert compare("y", expected, rounded, copy_of_half=True).ok
    # a meaning changed (0 for the mean of V; a row 5% off) is far past 1% of the row
    changed = expected.copy()
    changed[1] = expected[1] * 1.05
    assert not compare("y", expected, changed, copy_of_half=True).ok
    assert not compare("y", expected, np.zeros_like(expected), copy_of_half=True).ok
