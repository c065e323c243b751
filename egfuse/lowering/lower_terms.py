"""What every part of lowering shares: the value ↔ id table, e-graph term text, and the facts stated on
each e-class (dtype, rank, the dims rules compare, scalar values, weights, finiteness)."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from egfuse.analysis.dims import Dim, product
from egfuse.analysis.facts import GraphFacts


@dataclass
class Lowered:
    """The id ↔ value table shared by all regions lowered into one e-graph."""

    values: list[ir.Value] = field(default_factory=list)
    ids: dict[ir.Value, int] = field(default_factory=dict)
    leaves: set[int] = field(default_factory=set)
    commands: list[str] = field(default_factory=list)
    cuts: dict[str, ir.Value] = field(default_factory=dict)
    """A symbolic length → a graph value holding it (the Slice bound it came from), so a cut at it can be
    written again."""

    def id_of(self, value: ir.Value) -> int:
        if value not in self.ids:
            self.ids[value] = len(self.values)
            self.values.append(value)
        return self.ids[value]


def quoted(s: object) -> str:
    return '"' + str(s) + '"'


def float_text(x: float) -> str:
    text = repr(float(x))
    return text if ("." in text or "e" in text or "inf" in text or "nan" in text) else text + ".0"


def times(a: Dim | None, b: Dim | None) -> Dim | None:
    return product((a, b))


def axes_input(node: ir.Node, facts: GraphFacts) -> list[int] | None:
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = facts.const(node.inputs[1])
        return None if axes is None else [int(a) for a in axes.reshape(-1)]
    attr = node.attributes.get("axes")
    return None if attr is None else list(attr.value)


_TERM = "\x00"
"""Where the term goes in a value's fact lines (no term's text holds it)."""
_FACT_LINES: weakref.WeakKeyDictionary[GraphFacts, dict[tuple, list[str]]] = weakref.WeakKeyDictionary()
"""Per search (its facts): a value's fact lines, by (value, leaf or not, the names they were written with)."""


class TermWriter:
    """Writes one region's terms into the shared table; the op families' term writers
    (:mod:`~egfuse.lowering.lower_layout`, :mod:`~egfuse.lowering.lower_pieces`) build on it."""

    def __init__(self, facts: GraphFacts, names: dict[str, str], opset: int) -> None:
        self.facts = facts
        self.n = names
        self.opset = opset
        self.table = Lowered()
        self._inside: set[ir.Value] = set()  # values computed inside the region being lowered

    def _call(self, op: str, *args: str) -> str:
        return f"({self.n[op]} {' '.join(args)})" if args else f"({self.n[op]})"

    def _one_class(self, *readings: str | None) -> str | None:
        """Terms for one value that all hold (a Reshape read directly and through its chain of views, or two
        readings a unit dim makes true), stated as one e-class; the first is the value's term."""
        found = list(dict.fromkeys(r for r in readings if r is not None))
        for other in found[1:]:
            self.table.commands.append(f"(union {found[0]} {other})")
        return found[0] if found else None

    def _leaf(self, value: ir.Value) -> str:
        i = self.table.id_of(value)
        term = self._call("value", str(i))
        if i not in self.table.leaves:
            self.table.leaves.add(i)
            self.table.commands.append(term)
            self._facts(value, term, leaf=True)
            self._read_flag_cast(value, term)
        return term

    def _read_flag_cast(self, value: ir.Value, term: str) -> None:
        """A float cast of a boolean flag computed outside the region (a mask shared by every layer, which the
        first layer's region holds) is still read as ``cast(m)`` — or ``1 − cast(m)`` behind a ``Not`` — and so
        is such a cast times a scalar, so a select written as arithmetic on it is recognised in every layer."""
        node = value.producer()
        if node is None or value.dtype is None or not value.dtype.is_floating_point():
            return
        if node.op_type == "Mul" and len(node.inputs) == 2 and all(v is not None for v in node.inputs):
            flags = [v for v in node.inputs if self.facts.scalar(v) is None]
            if len(flags) == 1 and flags[0].producer() is not None and flags[0].producer().op_type == "Cast":
                scalar = next(v for v in node.inputs if v is not flags[0])
                product = self._call("mul", self._leaf(flags[0]), self._leaf(scalar))
                self.table.commands.append(f"(union {term} {product})")
            return
        if node.op_type != "Cast":
            return
        source = node.inputs[0]
        if source is None or source.dtype != ir.DataType.BOOL:
            return
        to = str(int(value.dtype))
        negated = source.producer()
        if negated is not None and negated.op_type == "Not":
            cast = self._call("cast", self._leaf(negated.inputs[0]), to)
            reading = self._call("sub", self._call("full_like", cast, float_text(1.0)), cast)
        else:
            reading = self._call("cast", self._leaf(source), to)
        self.table.commands.append(f"(union {term} {reading})")

    def _facts(self, value: ir.Value, term: str, leaf: bool) -> None:
        """The facts of ``value`` stated on ``term``: worked out once per value (a region is lowered alone and
        again into the search's e-graph, and a mask or weight every layer reads in each layer's region)."""
        known = _FACT_LINES.setdefault(self.facts, {})
        key = (value, leaf, id(self.n))
        lines = known.get(key)
        if lines is None:
            lines = known[key] = self._fact_lines(value, leaf)
        self.table.commands.extend(line.replace(_TERM, term) for line in lines)

    def _fact_lines(self, value: ir.Value, leaf: bool) -> list[str]:
        """The commands stating ``value``'s facts on the placeholder ``_TERM`` (a leaf also gets those of a
        value read from outside the region: its scalar, its stored weight's dims)."""
        term = _TERM
        cmds: list[str] = []
        if value.dtype is not None:
            cmds.append(f"(set ({self.n['dtype_of']} {term}) {int(value.dtype)})")
        cmds.extend(self._shape_fact_lines(value))
        if self.facts.finite(value):
            # a finite constant, a mask made of finite fills outside the region, or — inside it — a bias computed
            # from bounded values (ALiBi's slopes · positions, where the first region computes the shared bias)
            cmds.append(f"({self.n['finite']} {term})")
        if leaf:
            cmds.extend(self._leaf_fact_lines(value))
        return cmds

    def _shape_fact_lines(self, value: ir.Value) -> list[str]:
        """Rank and the dims rules compare: whether the heads axis is trivial, the rows, the heads, the last dim."""
        term = _TERM
        cmds: list[str] = []
        rank = self.facts.rank(value)
        if rank is not None:
            cmds.append(f"(set ({self.n['rank_of']} {term}) {rank})")
        shape = self.facts.shape(value)
        if rank is not None and shape is not None and len(shape) == rank:
            if rank <= 2 or shape[-3] == Dim(1):
                cmds.append(f"({self.n['head_invariant']} {term})")
            if rank >= 3 and shape[-2] is not None:  # rows: a cache's length, where its probabilities are cut
                cmds.append(f'(set ({self.n["dim_of"]} {term} -2) "{shape[-2]}")')
            if rank == 4 and shape[1] is not None and shape[1].static is not None:
                cmds.append(f"(set ({self.n['heads_of']} {term}) {shape[1].static})")
        cmds.extend(self._axis_dim_lines(rank, shape))
        if shape is not None and shape and shape[-1] is not None and shape[-1].static is not None:
            cmds.append(f"(set ({self.n['last_dim']} {term}) {shape[-1].static})")
        return cmds

    def _axis_dim_lines(self, rank: int | None, shape: tuple[Dim | None, ...] | None) -> list[str]:
        """The dims of the axes an attention layout names, by rank: what folding or merging them needs."""
        term = _TERM
        cmds: list[str] = []
        if rank == 4:  # heads and head size of a (B, N, S, H) tensor: what an op taking (B, S, N·H) needs
            for axis in (1, 3):
                if shape[axis] is not None and shape[axis].static is not None:
                    cmds.append(f'(set ({self.n["dim_of"]} {term} {axis}) "{shape[axis].static}")')
        elif rank == 5 and shape[1] is not None:
            # a window axis before the heads (B, W, N, S, H): the two leading dims, to fold them
            for axis in (0, 1):
                if shape[axis] is not None:
                    cmds.append(f'(set ({self.n["dim_of"]} {term} {axis}) "{shape[axis]}")')
            if shape[2] is not None and shape[2].static is not None:  # grouped heads (B, K, G, T, X): G
                cmds.append(f'(set ({self.n["dim_of"]} {term} 2) "{shape[2].static}")')
        elif rank == 3:  # the merged (B·N) batch of 3D attention: equal strings prove equal sizes
            first = shape[0]
            if first is not None:
                cmds.append(f'(set ({self.n["dim_of"]} {term} 0) "{first}")')
            last = shape[2]  # the head size of a (B, S, H) single head
            if last is not None and last.static is not None:
                cmds.append(f'(set ({self.n["dim_of"]} {term} 2) "{last.static}")')
        return cmds

    def _leaf_fact_lines(self, value: ir.Value) -> list[str]:
        """A leaf's scalar value, and a stored weight's trailing dims (and a cos/sin table's repeated halves)."""
        term = _TERM
        cmds: list[str] = []
        scalar = self.facts.scalar(value)
        if scalar is not None and not math.isnan(scalar):  # ±inf are kept: −inf is the usual mask fill
            cmds.append(f"(set ({self.n['scalar_of']} {term}) {float_text(scalar)})")
        const = self.facts.weight(value)
        stored = None if const is None else const.shape
        del const  # (a mapped weight is unmapped once summarised: no view of it may stay alive)
        if stored is not None:
            cmds.append(f"({self.n['is_weight']} {term})")
            for axis in (-1, -2)[: len(stored)]:
                cmds.append(f'(set ({self.n["dim_of"]} {term} {axis}) "{stored[axis]}")')
            if stored and all(d == 1 for d in stored[:-1]):
                cmds.append(f"({self.n['per_feature']} {term})")
        if stored is not None and len(stored) >= 2:
            summary = self.facts.summary(value)  # a stored cos/sin table: its halves compared, once
            if summary is not None and summary.pairs_repeat:
                cmds.extend(self._paired_table_lines(term, stored))
            if summary is not None and summary.halves_repeat:
                cmds.append(f"({self.n['halves_repeat']} {term})")
                for union, table in zip(*self._without_unit_axes(term, stored, (-3, -2)), strict=True):
                    cmds.extend((union, f"({self.n['halves_repeat']} {table})"))
        return cmds

    def _without_unit_axes(self, term: str, stored: tuple[int, ...], axes: tuple[int, ...]) -> tuple[list, list]:
        """A table stored with the heads axis already added (a decode step's folded (1, 1, S, R) table) is the
        table without each unit axis among ``axes``, that axis put back: the unions saying so, and the tables
        without it (what the rules' facts are stated on, as on a table whose Unsqueeze the graph writes)."""
        unions, squeezed = [], []
        if len(stored) == 4:
            for axis in axes:
                if stored[axis] == 1:
                    table = self._call("squeeze", term, str(axis))
                    unions.append(f"(union {term} {self._call('unsqueeze', table, str(axis))})")
                    squeezed.append(table)
        return unions, squeezed

    def _paired_table_lines(self, term: str, stored: tuple[int, ...]) -> list[str]:
        """A stored table with each entry twice in pairs is ``repeat_interleave`` of its even entries:
        ``t = interleave(t[..., 0::2], t[..., 0::2])`` — the interleaved RoPE table a static-shape export folds
        to a constant. Stored with the heads axis already added ((1, 1, S, R)), it is also that axis put back on
        the table without it, so the rules see the unsqueeze they look for."""
        cmds, squeezed = self._without_unit_axes(term, stored, (-3,))
        for table in [term, *squeezed]:
            even = self._call("strided", table, "0")
            cmds.append(f"(union {table} {self._call('interleave', even, even)})")
        return cmds

    def _arg(self, value: ir.Value | None, inside: set[ir.Value]) -> str | None:
        if value is None:
            return None
        if value in inside and self.facts.const(value) is None and not self._is_stored_weight(value):
            return self._call("ref", str(self.table.id_of(value)))
        return self._leaf(value)

    def _is_stored_weight(self, value: ir.Value) -> bool:
        """A weight behind Identity/Transpose: a leaf, so projections see it as the constant it is."""
        node = value.producer()
        return node is not None and node.op_type in ("Identity", "Transpose") and self.facts.weight(value) is not None

    def _is_constant(self, value: ir.Value | None) -> bool:
        return value is not None and (self.facts.const(value) is not None or value.const_value is not None)

    def _elements(self, value: ir.Value) -> tuple[Dim | None, ...] | None:
        """A 1-D int tensor's elements as dims: constants, or sizes read off shapes (``Shape(k)[2]``)."""
        const = self.facts.const(value)
        if const is not None and np.issubdtype(const.dtype, np.integer):
            return tuple(Dim(int(v)) for v in const.reshape(-1))
        return self.facts.elems(value)
