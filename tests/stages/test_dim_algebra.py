"""Symbolic dims in one normal form, so that two spellings of one length compare equal: torch writes a strided
convolution's output length as ``(x − 1)//2 + 1`` in one place and ``(x + 1)//2`` in another, and a Reshape's
−1 over a folded batch as ``(4·B·L²) // (L·(4·z + 4))`` with L = z + 1. SEW-D's dynamo export stopped there:
its mask's length and its scores' length differed in text only, and nothing fused."""

from __future__ import annotations

from egfuse.analysis.dims import Dim

LENGTH = "((((((((samples//5)) - 9)//4)) - 1)//2)) + 1"


def test_floor_quotients_by_an_integer_move_whole_multiples_out():
    assert Dim.parse(LENGTH) == Dim.parse("(((((((samples//5)) - 9)//4)) + 1)//2)")
    assert Dim.parse("(2*s0 + 3)//2") == Dim.parse("s0 + 1")
    assert Dim.parse("(s0 - 4)//2") == Dim.parse("s0//2 - 2")
    assert Dim.parse("(s0 + 1)//2") != Dim.parse("s0//2")  # 1 is no multiple of 2: a different length
    assert Dim.parse("(s0 + 1)//2") != Dim.parse("(s0 + 2)//2")


def test_a_floor_quotient_the_divisor_divides_exactly_is_the_quotient():
    batch = f"((4*batch*({LENGTH})**2)//(({LENGTH})*(4*((((((((samples//5)) - 9)//4)) - 1)//2)) + 4)))"
    assert Dim.parse(batch) == Dim.parse("batch")
    assert Dim.parse("(6*a*b)//(3*b)") == Dim.parse("2*a")
    assert Dim.parse("(a*b + 1)//b") != Dim.parse("a")  # not exact: kept as the quotient it is


def test_the_normal_form_keeps_the_value():
    """Every rewrite above is an identity on integers: evaluated, both spellings agree for every length."""
    for samples in range(45, 400, 7):
        x = (samples // 5 - 9) // 4
        assert (x - 1) // 2 + 1 == (x + 1) // 2
    for s0 in range(-9, 30):
        assert (2 * s0 + 3) // 2 == s0 + 1 and (s0 - 4) // 2 == s0 // 2 - 2
