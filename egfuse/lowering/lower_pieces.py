"""Terms for pieces and joins: Split, Slice, Squeeze/Unsqueeze of a unit heads axis, Concat — attention
written head by head (a Q split into per-head parts, per-head results concatenated) or a score read in
slices (a cache's past and new columns), as ``part``/``concat``/``cols_before``/``cols_from`` terms that
``rules/pieces.py`` joins again."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from egfuse.analysis.dims import Dim
from egfuse.lowering.lower_terms import TermWriter, axes_input, quoted


class PieceTerms(TermWriter):
    def _split(self, node: ir.Node, arg: str | None) -> None:
        """Each output of a Split is a ``part`` of its input (a query split head by head); an output whose
        piece is unknown is an opaque leaf."""
        pieces = self._split_pieces(node)
        for i, out in enumerate(node.outputs):
            ref = self._call("ref", str(self.table.id_of(out)))
            term = None
            if pieces is not None and arg is not None:
                axis, start, size = pieces[i]
                term = self._piece(node.inputs[0], arg, axis, start, size)
            if term is None:
                self.table.commands.append(f"(union {ref} {self._leaf(out)})")
                continue
            self.table.commands.append(f"(union {ref} {term})")
            self._facts(out, ref, leaf=False)

    def _split_pieces(self, node: ir.Node) -> list[tuple[int, int, int]] | None:
        """(axis from the end, start, size) of each output, where the input's axis is static."""
        shape, rank = self.facts.shape(node.inputs[0]), self.facts.rank(node.inputs[0])
        attr = node.attributes.get("axis")
        axis = 0 if attr is None else int(attr.value)
        if shape is None or rank is None or not -rank <= axis < rank:
            return None
        whole = shape[axis]
        if whole is None or whole.static is None:
            return None
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            sizes = self.facts.const(node.inputs[1])
            sizes = None if sizes is None else [int(v) for v in sizes.reshape(-1)]
        elif "split" in node.attributes:
            sizes = [int(v) for v in node.attributes["split"].value]
        else:
            count = len(node.outputs)
            chunk = -(-whole.static // count)
            sizes = [min(chunk, whole.static - i * chunk) for i in range(count)]
        if sizes is None or len(sizes) != len(node.outputs) or sum(sizes) != whole.static:
            return None
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return [(axis % rank - rank, start, size) for start, size in zip(starts, sizes, strict=True)]

    def _piece(self, value: ir.Value, arg: str, axis: int, start: int, size: int) -> str:
        """``value[…, start : start + size, …]``; on the last axis of (B, S, N·H) in pieces as wide as a head
        it is also that head of the head split (so per-head attention meets the heads it came from)."""
        plain = self._call("part", arg, str(axis), str(start), str(size))
        width = self.facts.shape(value)[axis]
        if axis != -1 or self.facts.rank(value) != 3 or size <= 0 or start % size or width.static % size:
            return plain
        heads = width.static // size
        split = self._call("transpose", self._call("split_heads", arg, quoted(heads), quoted(size)), quoted("0,2,1,3"))
        self.table.commands.append(f"(set ({self.n['heads_of']} {split}) {heads})")
        head = self._call("merge_lead", self._call("part", split, "-3", str(start // size), "1"), quoted(1))
        self.table.commands.append(f"(union {plain} {head})")
        return plain

    def _concat(self, node: ir.Node, args: list[str | None]) -> str | None:
        """An n-ary Concat as a left fold of binary joins; on the last axis of (B, S, H) pieces as wide as
        each other it is also the heads joined, (B, N, S, H) → (B, S, N·H), as head-by-head attention ends."""
        rank = self.facts.rank(node.outputs[0])
        attr = node.attributes.get("axis")
        if rank is None or attr is None or not -rank <= int(attr.value) < rank or len(args) < 2 or None in args:
            return None
        axis = int(attr.value) % rank - rank
        joined = args[0]
        for arg in args[1:]:
            joined = self._call("concat", joined, arg, str(axis))
        shapes = [self.facts.shape(v) for v in node.inputs]
        widths = {None if s is None or len(s) != 3 or s[-1] is None else s[-1].static for s in shapes}
        if axis != -1 or rank != 3 or len(widths) != 1 or None in widths:
            return joined
        (width,) = widths
        heads = self._call("split_lead", args[0], quoted(1))
        for arg in args[1:]:
            heads = self._call("concat", heads, self._call("split_lead", arg, quoted(1)), "-3")
        moved = self._call("transpose", heads, quoted("0,2,1,3"))
        self.table.commands.append(
            f"(union {joined} {self._call('merge_heads', moved, quoted(len(args)), quoted(width))})"
        )
        return joined

    def _slice(self, node: ir.Node, arg: str) -> str | None:
        """A Slice along one axis: a static piece is a ``part``; the last axis cut at a symbolic length (a
        KV cache's probabilities) is ``cols_before``/``cols_from``, the bound's value kept to write it again."""
        ins = node.inputs
        rank, shape = self.facts.rank(ins[0]), self.facts.shape(ins[0])
        if rank is None or shape is None or len(ins) < 3:
            return None
        axes = self.facts.const(ins[3]) if len(ins) > 3 and ins[3] is not None else np.arange(1)
        steps = self.facts.const(ins[4]) if len(ins) > 4 and ins[4] is not None else np.ones(1, np.int64)
        starts, ends = self._elements(ins[1]), self._elements(ins[2])
        if axes is None or steps is None or starts is None or ends is None or axes.size != 1 or len(starts) != 1:
            return None
        if len(ends) != 1 or not -rank <= int(axes.reshape(-1)[0]) < rank:
            return None
        axis = int(axes.reshape(-1)[0]) % rank - rank
        (start,), (end,) = starts, ends
        whole = shape[axis]
        if int(steps.reshape(-1)[0]) != 1:
            return self._strided(arg, axis, start, end, whole, int(steps.reshape(-1)[0]))
        to_end = end is not None and ((end.static is not None and end.static >= 2**31 - 1) or end == whole)
        if start is None or (end is None and not to_end):
            return None
        if start.static is not None and whole is not None and whole.static is not None and end.static is not None:
            first = min(max(start.static + (whole.static if start.static < 0 else 0), 0), whole.static)
            last = min(max(end.static + (whole.static if end.static < 0 else 0), 0), whole.static)
            piece = self._piece(ins[0], arg, axis, first, max(last - first, 0))
            cut = None
            if axis == -1 and first == 0 < last < whole.static and end.static >= 0:  # a prefix, cut at its end
                cut, bound, at = self._call("cols_before", arg, quoted(last)), ins[2], last
            elif axis == -1 and 0 < first == start.static and last == whole.static:  # the rest, from its start
                cut, bound, at = self._call("cols_from", arg, quoted(first)), ins[1], first
            if cut is not None:
                self.table.cuts.setdefault(str(at), bound)
                self.table.commands.append(f"(union {piece} {cut})")
            return piece
        if start.static == 0 and to_end:  # 0 to the end of an axis of unknown length: the whole tensor (dynamo
            return arg  # writes ``x[None, None, :, :]`` so; RoFormer's sinusoidal table, sliced whole twice)
        if axis != -1:  # rows cut at a length the graph computes (a cos table cut at the sequence length)
            return self._call("sliced", arg, str(axis)) if int(steps.reshape(-1)[0]) == 1 else None
        if start == Dim(0) and end.static is None:
            self.table.cuts.setdefault(str(end), ins[2])
            return self._call("cols_before", arg, quoted(end))
        if start == Dim(0) and end.static is not None and end.static < 0 and whole is not None:
            kept = whole.plus(Dim(-end.static), -1)  # all but the last columns (a sink's, gpt-oss): [:-1]
            self.table.cuts.setdefault(str(kept), ins[2])
            return self._call("cols_before", arg, quoted(kept))
        if start.static is None and to_end:
            self.table.cuts.setdefault(str(start), ins[1])
            return self._call("cols_from", arg, quoted(start))
        return None

    def _unit_heads_axis(self, node: ir.Node, arg: str) -> str | None:
        """Squeezing the unit axis 1 of a rank-4 tensor merges it into the batch, unsqueezing axis 1 of a rank-3
        one splits a unit axis off it: per-head attention's (B, 1, S, H) ↔ (B, S, H). Any Unsqueeze is also
        ``unsqueeze`` terms, one new axis at a time (a cos table unsqueezed at the heads axis)."""
        axes = axes_input(node, self.facts)
        rank = self.facts.rank(node.inputs[0])
        if axes is None or rank is None:
            return None
        if node.op_type == "Unsqueeze":
            return self._unsqueezed(arg, rank, axes)
        if len(axes) == 1 and rank == 4 and axes[0] % 4 == 1:
            shape = self.facts.shape(node.inputs[0])
            return self._call("merge_lead", arg, quoted(1)) if shape is not None and shape[1] == Dim(1) else None
        return None

    def _unsqueezed(self, arg: str, rank: int, axes: list[int]) -> str | None:
        out_rank = rank + len(axes)
        if len({a % out_rank for a in axes}) != len(axes) or not all(-out_rank <= a < out_rank for a in axes):
            return None
        term, current = arg, rank
        for axis in sorted(a % out_rank for a in axes):  # each axis of the result, inserted in ascending order
            current += 1
            term = self._call("unsqueeze", term, str(axis - current))
        if rank == 3 and [a % 4 for a in axes] == [1]:
            heads = self._call("split_lead", arg, quoted(1))
            self.table.commands.append(f"(union {heads} {term})")
            return heads
        return term

    def _strided(self, arg: str, axis: int, start: Dim | None, end: Dim | None, whole: Dim | None, step: int):
        """``a[…, 0::2]`` or ``a[…, 1::2]`` of an even-width last axis: the pairs an interleaved rotation swaps."""
        if axis != -1 or step != 2 or whole is None or whole.static is None or whole.static % 2:
            return None
        if start is None or start.static not in (0, 1) or end is None or end.static is None:
            return None
        if end.static < whole.static:
            return None
        return self._call("strided", arg, str(start.static))

    def _rows(self, node: ir.Node, args: list[str | None]) -> str | None:
        """``Gather`` of rows (axis 0) of a table of rank ≥ 2: the positions' rows of a cos/sin cache."""
        rank = self.facts.rank(node.inputs[0])
        attr = node.attributes.get("axis")
        if rank is None or rank < 2 or (0 if attr is None else int(attr.value)) % rank != 0:
            return None
        return self._call("rows", args[0], args[1])

    def _rows_nd(self, node: ir.Node, args: list[str | None]) -> str | None:
        """``GatherND`` whose index ends in 1 (no batch dims) picks whole rows of a table of rank ≥ 2."""
        rank, index = self.facts.rank(node.inputs[0]), self.facts.shape(node.inputs[1])
        batch = node.attributes.get("batch_dims")
        if rank is None or rank < 2 or not index or index[-1] != Dim(1) or (batch is not None and batch.value):
            return None
        return self._call("rows_nd", args[0], args[1])
