"""The tanh GELU: every spelling of ``x · ½ · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))`` is ``gelu_tanh(x)``.

GPT-2's ``gelu_new``, BLOOM's, Gemma's ``gelu_pytorch_tanh``, Keras' ``gelu(approximate=True)`` and torch's
``F.gelu(approximate="tanh")`` (decomposed below opset 20) spell it with the cube as ``Pow(x, 3)``, ``x · x · x``
or ``x · x²``, the polynomial expanded (``x + a·x³``) or factored (``x · (1 + a·x²)``), √(2/π) outside the
polynomial or multiplied into ``x`` first, and ½ anywhere — as the exact GELU's family
(:mod:`egfuse.rules.gelu`) has it. Each step is one identity onto a canonical term of this family's own
(``square``, ``cube``, ``gelu_tanh_quad``, ``gelu_tanh_poly``, ``gelu_tanh_arg``, ``gelu_tanh_cdf``), so the
spellings meet there instead of being listed whole. The two constants are the model's, equal to the exact ones
up to their rounding in its type, recognised once each (``cubic_coefficient``, ``root_two_over_pi``).

The family declares its constructors itself (:data:`CONSTRUCTORS`): the language's sort is shared, the names
are this family's, and :mod:`egfuse.kinds.tanh_gelu` is the one region kind that reads them.
"""

from __future__ import annotations

import math

from egglog import eq, f64, function, i64, relation, rewrite, rule, ruleset

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dtype_of, scalar_of

CUBIC = 0.044715
"""The cubic coefficient of the approximation (Hendrycks and Gimpel), as every framework writes it."""
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

TOLERANCES = {1: 1e-6, 10: 2.0**-11, 16: 2.0**-8}
"""How far a stored constant may be from the exact one, relatively, by its ``TensorProto`` type: float32's
rounding (and FastGELU's 10 digits of √(2/π)), half an ulp of float16 and of bfloat16."""


@function
def square(x: Tensor) -> Tensor:
    """``x · x``."""


@function
def cube(x: Tensor) -> Tensor:
    """``x · x · x``."""


@function
def gelu_tanh_quad(x: Tensor) -> Tensor:
    """``1 + 0.044715 · x²``: the polynomial's bracket where it is factored, ``x · (1 + a·x²)``."""


@function
def gelu_tanh_poly(x: Tensor) -> Tensor:
    """``x + 0.044715 · x³``."""


@function
def gelu_tanh_arg(x: Tensor) -> Tensor:
    """``√(2/π) · (x + 0.044715 · x³)``: tanh's argument."""


@function
def gelu_tanh_cdf(x: Tensor) -> Tensor:
    """``1 + tanh(gelu_tanh_arg(x))``: twice the approximated normal CDF."""


@function
def gelu_tanh(x: Tensor) -> Tensor:
    """``x · ½ · gelu_tanh_cdf(x)``: ``Gelu(approximate="tanh")`` (opset 20) or ``com.microsoft.FastGelu``."""


CONSTRUCTORS = {
    "square": square, "cube": cube, "gelu_tanh_quad": gelu_tanh_quad, "gelu_tanh_poly": gelu_tanh_poly,
    "gelu_tanh_arg": gelu_tanh_arg, "gelu_tanh_cdf": gelu_tanh_cdf, "gelu_tanh": gelu_tanh,
}  # fmt: skip
"""This family's constructors by name: what the e-graph reads back and the cost model and writers key on."""


cubic_coefficient = relation("tanh_gelu_cubic_coefficient", Tensor)
"""A constant holding 0.044715 in its type's precision."""
root_two_over_pi = relation("tanh_gelu_root_two_over_pi", Tensor)
"""A constant holding √(2/π) in its type's precision."""


def _near(c: Tensor, f: f64, exact: float):
    """``c`` holds ``exact`` as stored in float32 (any type, that closely), float16 or bfloat16: one list of
    conditions each."""
    for dtype, tolerance in TOLERANCES.items():
        typed = () if dtype == 1 else (eq(dtype_of(c)).to(i64(dtype)),)
        yield scalar_of(c) == f, *typed, f >= f64(exact * (1 - tolerance)), f <= f64(exact * (1 + tolerance))


@ruleset
def rules(x: Tensor, a: Tensor, c: Tensor, k: Tensor, one: Tensor, half: Tensor, f: f64):
    # The two constants, recognised once each (in the model's precision) and matched by name below.
    for near in _near(a, f, CUBIC):
        yield rule(*near).then(cubic_coefficient(a))
    for near in _near(c, f, SQRT_2_OVER_PI):
        yield rule(*near).then(root_two_over_pi(c))
    # Powers: x² and x³ as Pow or as products, in either association.
    yield rewrite(Tensor.mul(x, x)).to(square(x))
    yield rewrite(Tensor.pow(x, k)).to(square(x), scalar_of(k) == f64(2.0))
    yield rewrite(Tensor.pow(x, k)).to(cube(x), scalar_of(k) == f64(3.0))
    yield rewrite(Tensor.mul(square(x), x)).to(cube(x))
    yield rewrite(Tensor.mul(x, square(x))).to(cube(x))
    # A scalar factor moves out of a product of powers: (x · a) · x = x² · a, (x² · a) · x = x³ · a.
    is_scalar = scalar_of(a) == f
    yield rewrite(Tensor.mul(Tensor.mul(x, a), x)).to(Tensor.mul(square(x), a), is_scalar)
    yield rewrite(Tensor.mul(x, Tensor.mul(x, a))).to(Tensor.mul(square(x), a), is_scalar)
    yield rewrite(Tensor.mul(Tensor.mul(square(x), a), x)).to(Tensor.mul(cube(x), a), is_scalar)
    yield rewrite(Tensor.mul(x, Tensor.mul(square(x), a))).to(Tensor.mul(cube(x), a), is_scalar)
    # The polynomial expanded, x + a·x³, or factored, x · (1 + a·x²) (graph constants come second).
    yield rewrite(Tensor.add(x, Tensor.mul(cube(x), a))).to(gelu_tanh_poly(x), cubic_coefficient(a))
    yield rewrite(Tensor.add(Tensor.mul(cube(x), a), x)).to(gelu_tanh_poly(x), cubic_coefficient(a))
    is_one = scalar_of(one) == f64(1.0)
    yield rewrite(Tensor.add(Tensor.mul(square(x), a), one)).to(gelu_tanh_quad(x), cubic_coefficient(a), is_one)
    yield rewrite(Tensor.mul(x, gelu_tanh_quad(x))).to(gelu_tanh_poly(x))
    yield rewrite(Tensor.mul(gelu_tanh_quad(x), x)).to(gelu_tanh_poly(x))
    # √(2/π) outside the polynomial, or multiplied into x before the bracket: (x · c) · (1 + a·x²) = c · poly(x).
    yield rewrite(Tensor.mul(gelu_tanh_poly(x), c)).to(gelu_tanh_arg(x), root_two_over_pi(c))
    yield rewrite(Tensor.mul(Tensor.mul(x, c), gelu_tanh_quad(x))).to(gelu_tanh_arg(x), root_two_over_pi(c))
    yield rewrite(Tensor.mul(gelu_tanh_quad(x), Tensor.mul(x, c))).to(gelu_tanh_arg(x), root_two_over_pi(c))
    yield rewrite(Tensor.add(Tensor.tanh(gelu_tanh_arg(x)), one)).to(gelu_tanh_cdf(x), is_one)
    # ½ applied last, to x first, or to the bracket first; or a division by 2 last (the exact GELU's orders).
    is_half = scalar_of(half) == f64(0.5)
    cdf = gelu_tanh_cdf(x)
    for product in (Tensor.mul(x, cdf), Tensor.mul(cdf, x)):
        yield rewrite(Tensor.mul(product, half)).to(gelu_tanh(x), is_half)
        yield rewrite(Tensor.div(product, half)).to(gelu_tanh(x), scalar_of(half) == f64(2.0))
    half_x, half_cdf = Tensor.mul(x, half), Tensor.mul(cdf, half)
    for left, right in ((half_x, cdf), (cdf, half_x), (x, half_cdf), (half_cdf, x)):
        yield rewrite(Tensor.mul(left, right)).to(gelu_tanh(x), is_half)
