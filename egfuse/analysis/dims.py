"""Symbolic dimensions: just enough algebra to read what a Reshape means.

A dim is a monomial ``coef · sym₁ · sym₂ …`` (``Dim``) or unknown (``None``). Exported graphs mostly multiply
and divide dims (batch·heads, hidden/heads); where they add (``s0*(s1//10) - s0``: a convolution's output
length times the batch, written differently by shape inference and by the exporter), the sum is brought to a
normal form — a polynomial over atoms (symbols, and floor quotients kept whole) with its terms in a fixed
order — and carried as one symbol holding that form's text, so two spellings of one size compare equal.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import onnx
import onnx_ir as ir

from egfuse.analysis.dim_eval import evaluate
from egfuse.analysis.dim_polys import Poly, is_sum, normal_form, parse_poly, poly_div, poly_mul, poly_of
from egfuse.files import protos

__all__ = ["Dim", "Shape", "evaluate", "integer_text_dims", "product", "reshape_result", "shape_of"]


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
        poly = parse_poly(text)
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
        return any(is_sum(sym) for sym in self.syms)

    def __mul__(self, other: Dim) -> Dim:
        if self.summed or other.summed:
            return _from_poly(poly_mul(_to_poly(self), _to_poly(other)))
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
            quotient = poly_div(_to_poly(self), _to_poly(other))
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


def _to_poly(d: Dim) -> Poly:
    return poly_of(d.coef, d.syms)


def _from_poly(poly: Poly) -> Dim:
    return Dim(*normal_form(poly))


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
            for sub in protos.subgraphs(node):
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
