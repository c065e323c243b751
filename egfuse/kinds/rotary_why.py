"""Why a rotation did not become ``rotary``: the first condition of :mod:`egfuse.rules.rotary` the saturated
e-graph does not hold (onnxscript's rewriter calls this a ``check``: a failed match explained).

The rules build ``rotary(x, cos, sin, …)`` in steps — the rotate of x, each product with its table
(``rotary_cos``, ``rotary_sin``: the table unsqueezed at x's heads axis, its halves proven to repeat), their sum,
a partial rotation's concatenation back — so the explanation reads the e-classes of the rotation's own values
in that order and names the first step whose class lacks its term, with the fact it was missing. It reads what
the rules proved, never the graph's spelling: a rotation the rules cannot prove is explained in their terms.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from egfuse.egraph.enodes import value_index, view
from egfuse.egraph.session import EClass
from egfuse.writing.region_writer import ClassReader

__all__ = ["RotationValues", "variant", "why_not"]

_KEEPS_HALVES = ("cos", "sin", "neg", "cast", "mul", "div", "rows", "rows_nd", "unsqueeze", "sliced", "part")
"""Constructors through which a table keeps repeated halves (:mod:`egfuse.rules.rotary`'s first rules)."""
_HEADS_AXES = (-3, -2)
"""Where the tables gain their unit axis: x's heads axis counted from the end, (B, N, S, H) or (B, S, N, H)."""


@dataclass(frozen=True)
class RotationValues:
    """The graph values a rotation's steps compute, found with its region: rotate(x), rotate(x)·sin, x·cos,
    their sum, and the rotation's output (the sum, or a partial rotation's concatenation back)."""

    rotated: ir.Value
    sin_term: ir.Value | None
    cos_term: ir.Value | None
    total: ir.Value | None
    output: ir.Value


def why_not(values: RotationValues, spelling: str, g: ClassReader) -> str:
    """The first step of the rotation the rules did not reach, and the fact it lacked (``g``: the e-graph as
    the region sees it, :meth:`~egfuse.writing.region_writer.RegionWriter.reader`)."""
    if spelling in ("split-halves", "strided-halves"):
        halves = "x's halves" if spelling == "split-halves" else "x's even and odd features"
        if not g.nodes(g.of(values.total), "rotary"):
            return (f"the pieces are not rotated as [x₁·c − x₂·s, x₂·c + x₁·s] with x₁, x₂ {halves} and one pair of "
                    "half-width tables unsqueezed at x's heads axis")  # fmt: skip
        return "the rotated part is not concatenated back with x[..., R:]"
    x, why = _rotated_tensor(g, g.of(values.rotated), spelling)
    if x is None:
        return why
    if g.fact("rank_of", x) != 4:
        return "the rotated tensor is not known to be 4D"
    for name, term, constructor in (("sin", values.sin_term, "rotary_sin"), ("cos", values.cos_term, "rotary_cos")):
        if not g.nodes(g.of(term), constructor):
            return _term_why_not(g, name, term, x, values.rotated, spelling)
    if not g.nodes(g.of(values.total), "rotary"):
        return "the cos and sin terms do not rotate the same x with tables on the same axis and pairing"
    if not g.nodes(g.of(values.output), "rotary"):
        return "the rotated part is not concatenated back with x[..., R:]"
    return "the rules prove no rotation here (a missing identity?)"


def variant(values: RotationValues, spelling: str, g: ClassReader) -> str:
    """The report's name for the rotation: its pairing, and how many of x's features it rotates where not all
    (read off the ``rotary`` term the rules proved; the spelling alone where they proved none)."""
    proven = g.nodes(g.of(values.output), "rotary")
    if not proven:
        return spelling
    term = view(proven[0])
    kind = "interleaved" if int(term.interleaved) else "rotate-half"
    width, head = int(term.rotary_dim), g.fact("last_dim", term.x)
    return kind if head is None or width == int(head) else f"{kind}, partial ({width} of {int(head)} features)"


def _rotated_tensor(g: ClassReader, rotated: EClass | None, spelling: str) -> tuple[EClass | None, str]:
    """x, where rotate(x)'s class holds the rules' rotate of it; else None and why."""
    if spelling == "interleaved":
        for node in g.nodes(rotated, "interleave"):
            odd = [n for m in g.nodes(view(node).a, "neg") for n in g.nodes(view(m).a, "strided")]
            even = g.nodes(view(node).b, "strided")
            for a in odd:
                if any(view(b).a == view(a).a and int(view(b).start) == 0 for b in even) and int(view(a).start) == 1:
                    return view(a).a, ""
        return None, "the pairs are not (−x[..., 1::2], x[..., 0::2]) stacked on a new last axis and flattened"
    concats = [n for n in g.nodes(rotated, "concat") if int(view(n).axis) == -1]
    if not concats:
        return None, "rotate_half does not concatenate along the last axis"
    for node in concats:
        for neg in g.nodes(view(node).a, "neg"):
            for second in g.nodes(view(neg).a, "part"):
                firsts = [p for p in g.nodes(view(node).b, "part") if view(p).a == view(second).a]
                if int(view(second).axis) == -1 and any(int(view(p).axis) == -1 for p in firsts):
                    return view(second).a, ""
    return None, "the swapped halves are not two slices of x's last axis"


def _term_why_not(g: ClassReader, name: str, term: ir.Value | None, x: EClass, rotated: ir.Value, spelling: str) -> str:
    """Why ``term`` (x·cos or rotate(x)·sin) holds no rotary term: its table's axis, pairing, or halves."""
    source = g.of(rotated) if name == "sin" else x
    products = [n for n in g.nodes(g.of(term), "mul") if source in (view(n).a, view(n).b)]
    if not products:
        return f"the rotation's {name} term is not a product of {'rotate(x)' if name == 'sin' else 'x'} and a table"
    tables = [view(n).b if view(n).a == source else view(n).a for n in products]
    if spelling == "interleaved":
        spread = [t for t in tables for n in g.nodes(t, "interleave") if view(n).a == view(n).b]
        if not spread:
            what = _origin(g, tables[0])
            return f"the {name} table is not repeat_interleave(t, 2), each entry twice in pairs ({what})"
        tables = [view(n).a for t in spread for n in g.nodes(t, "interleave")]
    unsqueezed = [n for t in tables for n in g.nodes(t, "unsqueeze") if int(view(n).axis) in _HEADS_AXES]
    if not unsqueezed:
        return f"the {name} table is not unsqueezed at x's heads axis"
    if spelling == "interleaved":
        return f"the {name} table does not pair with x's last axis (its width is not x's)"
    if name == "sin" and g.fact("last_dim", x) is None:
        return "the swapped halves are not x[..., :R/2] and x[..., R/2:] (x's last axis has no known width)"
    if not any(g.fact("halves_repeat", view(n).a) for n in unsqueezed):
        return f"the {name} table's halves are not provably equal ({_halves_stop(g, view(unsqueezed[0]).a)})"
    return f"the swapped halves are not x[..., :R/2] and x[..., R/2:] for the {name} table's width"


def _halves_stop(g: ClassReader, cid: EClass, depth: int = 8) -> str:
    """Where the proof that a table repeats its halves stops: the class below which no rule carried it."""
    for node in g.nodes(cid):
        if node.op in _KEEPS_HALVES and depth > 0:
            below = view(node)[0]  # the table the rule carries the fact from (``a``; ``table`` of rows)
            if g.fact("halves_repeat", below) is None:
                return _halves_stop(g, below, depth - 1)
    return _origin(g, cid, stored="a stored table whose halves differ")


def _origin(g: ClassReader, cid: EClass, stored: str = "a stored table") -> str:
    """What a table's class is, where the rules could carry no fact through it: an input, a stored tensor, or
    what computes it."""
    leaves = [n for n in g.nodes(cid) if n.op == "value"]
    if leaves:
        value = g.writer.table.values[value_index(leaves[0])]
        if value.is_graph_input():
            return "an input of the graph"
        if value.const_value is not None or g.fact("is_weight", cid):
            return stored
        producer = value.producer()
        return f"it comes from {producer.op_type if producer is not None else 'outside the graph'}"
    computed = sorted({n.op for n in g.nodes(cid) if n.op != "ref"})
    return f"it comes from {computed[0]}" if computed else "too deep"
