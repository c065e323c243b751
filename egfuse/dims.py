"""Symbolic dimensions: just enough algebra to read what a Reshape means.

A dim is a monomial ``coef · sym₁ · sym₂ …`` (``Dim``) or unknown (``None``). Exported graphs mostly multiply
and divide dims (batch·heads, hidden/heads); where they add (``s0*(s1//10) - s0``: a convolution's output
length times the batch, written differently by shape inference and by the exporter), the sum is brought to a
normal form — a polynomial over atoms (symbols, and floor quotients kept whole) with its terms in a fixed
order — and carried as one symbol holding that form's text, so two spellings of one size compare equal.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

import onnx
import onnx_ir as ir


@dataclass(frozen=True, order=True)
class Dim:
    coef: int
    syms: tuple[str, ...] = ()

    @staticmethod
    def of(d: object) -> Dim | None:
        """From an onnx-ir dim (int or SymbolicDim) or a plain int/str; ``None`` where unknown."""
        if isinstance(d, Dim):
            return d
        if isinstance(d, int):
            return Dim(d) if d >= 0 else None  # (shapes only: reshape specs keep -1 as Dim(-1))
        if isinstance(d, ir.SymbolicDim):
            return Dim.parse(d.value) if d.value else None
        if isinstance(d, str):
            return Dim.parse(d) if d else None
        return None

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def parse(text: str) -> Dim:
        """A product as exporters write it ("4*batch", "s0*s1"), a sum of products in its normal form
        ("s0*(s1//10) - s0"); anything else is one opaque symbol."""
        factors = [f.strip() for f in text.split("*")]
        if not any(c in text for c in "+-/()") and all(factors):
            coef, syms = 1, []
            for f in factors:
                if f.isdigit():
                    coef *= int(f)
                else:
                    syms.append(f)
            return Dim(coef, tuple(sorted(syms)))
        poly = _parse_poly(text)
        return Dim(1, (text,)) if poly is None else _from_poly(poly)

    @property
    def invented(self) -> bool:
        """A name ONNX shape inference made up (``unk__N``) where it lost track: a weaker name than the
        exporter's for the same run-time size."""
        return any(sym.startswith("unk__") for sym in self.syms)

    @property
    def static(self) -> int | None:
        return None if self.syms else self.coef

    @property
    def summed(self) -> bool:
        """A sum of products carried as its normal form's text (see the module docstring)."""
        return any(_is_sum(sym) for sym in self.syms)

    def __mul__(self, other: Dim) -> Dim:
        if self.summed or other.summed:
            return _from_poly(_poly_mul(_to_poly(self), _to_poly(other)))
        return Dim(self.coef * other.coef, tuple(sorted(self.syms + other.syms)))

    def plus(self, other: Dim, sign: int = 1) -> Dim:
        """``self + sign·other`` in the normal form: a monomial again wherever the terms cancel or merge."""
        poly = dict(_to_poly(self))
        for term, coef in _to_poly(other).items():
            poly[term] = poly.get(term, 0) + sign * coef
        return _from_poly(poly)

    def div(self, other: Dim) -> Dim | None:
        """Exact quotient, or ``None`` when ``other`` does not divide ``self``."""
        if self.summed or other.summed:
            quotient = _poly_div(_to_poly(self), _to_poly(other))
            return None if quotient is None else _from_poly(quotient)
        if other.coef == 0 or self.coef % other.coef:
            return None
        rest = list(self.syms)
        for s in other.syms:
            if s not in rest:
                return None
            rest.remove(s)
        return Dim(self.coef // other.coef, tuple(rest))

    def __str__(self) -> str:
        if not self.syms:
            return str(self.coef)
        body = "*".join(self.syms)
        return body if self.coef == 1 else f"{self.coef}*{body}"


Shape = tuple[Dim | None, ...]

Poly = dict[tuple[str, ...], int]  # sorted atoms of a term → its coefficient


def _is_sum(sym: str) -> bool:
    return " + " in sym or " - " in sym or sym.startswith("-")


def _to_poly(d: Dim) -> Poly:
    poly: Poly = {(): d.coef}
    for sym in d.syms:
        factor = _parse_poly(sym) if _is_sum(sym) else None
        poly = _poly_mul(poly, factor if factor is not None else {(sym,): 1})
    return poly


def _poly_mul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ta, ca in a.items():
        for tb, cb in b.items():
            term = tuple(sorted(ta + tb))
            out[term] = out.get(term, 0) + ca * cb
    return out


def _poly_div(a: Poly, b: Poly) -> Poly | None:
    """Exact quotient ``a / b`` of two polynomials, or ``None`` where ``b`` does not divide ``a`` — long division
    under a graded order (the leading term of a product is the product of the leading terms, so an exact
    quotient shows itself term by term): ``(8·past + 8·new)·B·4 / (8·past + 8·new)`` is ``4·B``, the folded
    batch of a cache's keys reshaped with -1."""
    atoms = sorted({s for term in (*a, *b) for s in term})

    def order(term: tuple[str, ...]) -> tuple:
        return (len(term), tuple(term.count(atom) for atom in atoms))

    divisor = {t: c for t, c in b.items() if c}
    remainder = {t: c for t, c in a.items() if c}
    if not divisor:
        return None
    lead = max(divisor, key=order)
    quotient: Poly = {}
    while remainder:
        term = max(remainder, key=order)
        rest = list(term)
        for atom in lead:
            if atom not in rest:
                return None
            rest.remove(atom)
        if remainder[term] % divisor[lead]:
            return None
        q_term, q_coef = tuple(sorted(rest)), remainder[term] // divisor[lead]
        quotient[q_term] = quotient.get(q_term, 0) + q_coef
        for t, c in divisor.items():
            product_term = tuple(sorted(q_term + t))
            remainder[product_term] = remainder.get(product_term, 0) - q_coef * c
            if not remainder[product_term]:
                del remainder[product_term]
    return quotient


def _term_text(term: tuple[str, ...], coef: int) -> str:
    if not term:
        return str(coef)
    return "*".join(term) if coef == 1 else f"{coef}*" + "*".join(term)


def _from_poly(poly: Poly) -> Dim:
    terms = sorted(((t, c) for t, c in poly.items() if c), key=lambda tc: (-len(tc[0]), tc[0]))
    if not terms:
        return Dim(0)
    if len(terms) == 1:
        term, coef = terms[0]
        return Dim(coef, term)
    text = _term_text(*terms[0])
    for term, coef in terms[1:]:
        text += f" - {_term_text(term, -coef)}" if coef < 0 else f" + {_term_text(term, coef)}"
    return Dim(1, (text,))


@functools.lru_cache(maxsize=4096)
def _parse_poly(text: str) -> Poly | None:
    """A dim's text as a polynomial (``+ - *`` and integers over names; a floor quotient, ``/`` or a call is one
    atom written from its operands' normal forms); ``None`` where the text is no such expression."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None

    def walk(node: ast.AST) -> Poly | None:
        if isinstance(node, ast.Name):
            return {(node.id,): 1}
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return {(): node.value}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = walk(node.operand)
            return None if inner is None else {t: -c for t, c in inner.items()}
        if isinstance(node, ast.BinOp):
            a, b = walk(node.left), walk(node.right)
            if a is None or b is None:
                return None
            if isinstance(node.op, ast.Mult):
                return _poly_mul(a, b)
            if isinstance(node.op, ast.Add | ast.Sub):
                sign = 1 if isinstance(node.op, ast.Add) else -1
                out = dict(a)
                for t, c in b.items():
                    out[t] = out.get(t, 0) + sign * c
                return out
            op = {ast.FloorDiv: "//", ast.Div: "/", ast.Mod: "%"}.get(type(node.op))
            if op is None:
                return None
            atom = f"({_atom_text(a)}){op}({_atom_text(b)})"
            return {(atom,): 1}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            args = [walk(arg) for arg in node.args]
            if any(arg is None for arg in args):
                return None
            return {(f"{node.func.id}(" + ", ".join(_atom_text(arg) for arg in args) + ")",): 1}  # type: ignore[arg-type]
        return None

    return walk(tree)


_CALLS: dict[str, Callable[..., int]] = {
    "Max": max, "max": max, "Min": min, "min": min, "Abs": abs, "abs": abs,
    "floor": math.floor, "ceil": math.ceil, "FloorDiv": operator.floordiv, "Mod": operator.mod,
}  # fmt: skip
_BINARY: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Div: operator.floordiv,
}


def evaluate(text: str, size_of: Callable[[str], int]) -> int | None:
    """The number a dim's text comes to once each name has a size, or ``None`` where the text is no expression
    over ``+ - * // % /`` and the calls exporters write (``Max(0, 1 - s)``: torch's symbolic shapes). A call is one
    atom of a polynomial, so expanding polynomials never gets rid of it: only evaluation does."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None

    def walk(node: ast.AST) -> int | None:
        if isinstance(node, ast.Name):
            return size_of(node.id)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = walk(node.operand)
            return None if inner is None else -inner
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            a, b = walk(node.left), walk(node.right)
            if a is None or b is None or (b == 0 and not isinstance(node.op, ast.Add | ast.Sub | ast.Mult)):
                return None
            return _BINARY[type(node.op)](a, b)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS:
            args = [walk(arg) for arg in node.args]
            if not args or any(arg is None for arg in args) or node.keywords:
                return None
            return int(_CALLS[node.func.id](*args))
        return None

    return walk(tree)


def _atom_text(poly: Poly) -> str:
    d = _from_poly(poly)
    return str(d)


def shape_of(value: ir.Value) -> Shape | None:
    if value.shape is None:
        return None
    return tuple(Dim.of(d) for d in value.shape)


def product(dims: Shape) -> Dim | None:
    out = Dim(1)
    for d in dims:
        if d is None:
            return None
        out = out * d
    return out


def reshape_result(in_shape: Shape | None, spec: tuple[Dim | int | None, ...], allowzero: bool = False) -> Shape:
    """The output shape of ``Reshape(x, spec)`` from x's symbolic shape. ``spec`` holds ``Dim`` entries,
    the literal ints ``0`` (copy the input dim) and ``-1`` (infer), and ``None`` where the spec is unknown."""
    out: list[Dim | None] = []
    minus_one_at = None
    for i, d in enumerate(spec):
        if isinstance(d, Dim) and not d.syms and d.coef in (0, -1):
            d = d.coef
        if isinstance(d, int) and d == 0 and not allowzero:
            out.append(in_shape[i] if in_shape is not None and i < len(in_shape) else None)
        elif isinstance(d, int) and d == -1:
            minus_one_at = i
            out.append(None)
        elif isinstance(d, int):
            out.append(Dim(d))
        else:
            out.append(d)
    unknown = [i for i, d in enumerate(out) if d is None]
    if minus_one_at is None and len(unknown) == 1:
        # One entry computed where nothing follows its value (tf2onnx's Max of two batch sizes): a Reshape keeps
        # the element count, so it is what the others leave — as a -1 would be.
        minus_one_at = unknown[0]
    if minus_one_at is not None and in_shape is not None:
        total = product(in_shape)
        known = product(tuple(d for i, d in enumerate(out) if i != minus_one_at))
        if total is not None and known is not None:
            out[minus_one_at] = total.div(known)
    return tuple(out)


def integer_text_dims(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with every dim written as text of digits (``'32'``: torch 2.1–2.4's dynamo exporter names fixed
    sizes so) written as the integer it is — a copy, or ``proto`` itself when it has none. ONNX shape inference
    takes ``'3'`` for a symbol: ``'3' + 5`` along a Concat becomes an unknown it invents, where 8 is known."""

    def infos(graph: onnx.GraphProto):
        yield from (*graph.input, *graph.output, *graph.value_info)
        for node in graph.node:
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    yield from infos(sub)

    def text_dims(model: onnx.ModelProto):
        for info in infos(model.graph):
            if info.type.HasField("tensor_type"):
                yield from (d for d in info.type.tensor_type.shape.dim if d.dim_param.strip().isdigit())

    if next(text_dims(proto), None) is None:
        return proto
    fixed = onnx.ModelProto()
    fixed.CopyFrom(proto)
    for d in list(text_dims(fixed)):
        d.dim_value = int(d.dim_param)  # setting the value clears the oneof's text
    return fixed
