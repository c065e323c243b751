"""ONNX region → e-graph terms.

Each ONNX value of a region gets an id; a value computed inside the region is ``(ref id)`` unioned with the
term for its producer, a value from outside (or a known constant) is the leaf ``(value id)``. Facts the rules
condition on (rank, scalar value, weight, finiteness) are set on the e-classes here. Reshapes are read
through symbolic shapes into what they mean (``split_heads`` …), so rules never need shapes themselves.
Commutative operands are put in canonical order (constant second), instead of general AC rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from egfuse.dims import Dim, product, reshape_result
from egfuse.facts import GraphFacts
from egfuse.lang import perm_string
from egfuse.regions import Region, is_inference_dropout


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


def _q(s: object) -> str:
    return '"' + str(s) + '"'


def _f(x: float) -> str:
    text = repr(float(x))
    return text if ("." in text or "e" in text or "inf" in text or "nan" in text) else text + ".0"


class Lowerer:
    def __init__(self, facts: GraphFacts, names: dict[str, str], opset: int) -> None:
        self.facts = facts
        self.n = names
        self.opset = opset
        self.table = Lowered()
        self._inside: set[ir.Value] = set()  # values computed inside the region being lowered

    # --- term text helpers -----------------------------------------------------------------------------------
    def _call(self, op: str, *args: str) -> str:
        return f"({self.n[op]} {' '.join(args)})" if args else f"({self.n[op]})"

    def _leaf(self, value: ir.Value) -> str:
        i = self.table.id_of(value)
        term = self._call("value", str(i))
        if i not in self.table.leaves:
            self.table.leaves.add(i)
            self.table.commands.append(term)
            self._facts(value, term, leaf=True)
        return term

    def _facts(self, value: ir.Value, term: str, leaf: bool) -> None:
        cmds = self.table.commands
        if value.dtype is not None:
            cmds.append(f"(set ({self.n['dtype_of']} {term}) {int(value.dtype)})")
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
        if rank == 4:  # heads and head size of a (B, N, S, H) tensor: what an op taking (B, S, N·H) needs
            for axis in (1, 3):
                if shape[axis] is not None and shape[axis].static is not None:
                    cmds.append(f'(set ({self.n["dim_of"]} {term} {axis}) "{shape[axis].static}")')
        elif rank == 3:  # the merged (B·N) batch of 3D attention: equal strings prove equal sizes
            first = shape[0]
            if first is not None:
                cmds.append(f'(set ({self.n["dim_of"]} {term} 0) "{first}")')
            last = shape[2]  # the head size of a (B, S, H) single head
            if last is not None and last.static is not None:
                cmds.append(f'(set ({self.n["dim_of"]} {term} 2) "{last.static}")')
        if not leaf:
            return
        scalar = self.facts.scalar(value)
        if scalar is not None and not math.isnan(scalar):  # ±inf are kept: −inf is the usual mask fill
            cmds.append(f"(set ({self.n['scalar_of']} {term}) {_f(scalar)})")
        const = self.facts.weight(value)
        if const is not None:
            cmds.append(f"({self.n['is_weight']} {term})")
            for axis in (-1, -2)[: const.ndim]:
                cmds.append(f'(set ({self.n["dim_of"]} {term} {axis}) "{const.shape[axis]}")')
        if const is not None and np.issubdtype(const.dtype, np.number) and np.all(np.isfinite(const)):
            cmds.append(f"({self.n['finite']} {term})")

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

    # --- regions ---------------------------------------------------------------------------------------------
    def lower(self, region: Region) -> None:
        produced = self._inside = {v for node in region.nodes for v in node.outputs}
        escaping = set(region.outputs) - {region.main_output}  # kept by the graph whatever the region becomes
        for node in region.nodes:
            out = node.outputs[0]
            if self.facts.const(out) is not None:
                continue  # constant bookkeeping: its users see a leaf with the value as a fact
            args = [self._arg(v, produced) for v in node.inputs]
            if node.op_type == "Split":
                self._split(node, args[0])
                continue
            term = self._term(node, args)
            ref = self._call("ref", str(self.table.id_of(out)))
            if term is None:  # an op form the rules do not know: keep it as an opaque leaf value
                self.table.commands.append(f"(union {ref} {self._leaf(out)})")
                continue
            self.table.commands.append(f"(union {ref} {term})")
            self._facts(out, ref, leaf=False)
            if node.op_type == "Concat" and out in escaping:
                # A join the graph keeps anyway (a KV cache's present output): reading it costs nothing more.
                self.table.commands.append(f"(union {ref} {self._leaf(out)})")

    def _term(self, node: ir.Node, args: list[str | None]) -> str | None:
        op = node.op_type
        ins = node.inputs
        if any(a is None for a in args[: _required_inputs(op)]):
            return None
        if op == "Max" and len(args) == 2:
            a, b = args[0], args[1]
            if self._is_constant(ins[0]) and not self._is_constant(ins[1]):
                a, b = b, a  # canonical order: the constant operand second
            return self._call("maximum", a, b)
        if op in ("Add", "Mul"):
            a, b = args[0], args[1]
            if self._is_constant(ins[0]) and not self._is_constant(ins[1]):
                a, b = b, a  # canonical order: the constant operand second
            return self._call(op.lower(), a, b)
        if op in ("Sub", "Div", "MatMul"):
            return self._call(op.lower(), args[0], args[1])
        if op == "Where":
            return self._call("where", *args[:3])
        if op == "Dropout":
            return args[0] if is_inference_dropout(node, self.facts) else None
        if op == "Expand":
            return self._expand(node, args[0])
        if op == "Identity":
            return args[0]
        if op in ("IsNaN", "Sqrt", "Tanh"):
            return self._call(op.lower(), args[0])
        if op == "Cast":
            to = int(node.attributes["to"].value)
            if ins[0].dtype is not None and int(ins[0].dtype) == to:
                return args[0]  # a cast to the dtype it already has is the identity
            return self._call("cast", args[0], str(to))
        if op == "CastLike" and ins[1] is not None and ins[1].dtype is not None:
            to = int(ins[1].dtype)  # a Cast to the like-operand's dtype (torch 2.1's softmax ends in one)
            if ins[0].dtype is not None and int(ins[0].dtype) == to:
                return args[0]
            return self._call("cast", args[0], str(to))
        if op == "Softmax":
            return self._softmax(node, args[0])
        if op == "Transpose":
            rank = self.facts.rank(ins[0])
            perm_attr = node.attributes.get("perm")
            if perm_attr is None and rank is None:
                return None
            perm = list(perm_attr.value) if perm_attr is not None else list(reversed(range(rank)))
            return self._call("transpose", args[0], _q(perm_string(perm)))
        if op == "Reshape":
            return self._reshape(node, args)
        if op == "Einsum" and len(args) == 2:
            return self._einsum(node, args)
        if op == "Einsum" and len(args) == 1:
            return self._einsum_permutation(node, args[0])
        if op == "Conv":
            return self._conv1x1(node, args)
        if op == "Concat":
            return self._concat(node, args)
        if op == "Slice":
            return self._slice(node, args[0])
        if op in ("Squeeze", "Unsqueeze"):
            return self._unit_heads_axis(node, args[0])
        return None

    # --- pieces and joins ----------------------------------------------------------------------------------
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
        split = self._call("transpose", self._call("split_heads", arg, _q(heads), _q(size)), _q("0,2,1,3"))
        self.table.commands.append(f"(set ({self.n['heads_of']} {split}) {heads})")
        head = self._call("merge_lead", self._call("part", split, "-3", str(start // size), "1"), _q(1))
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
        heads = self._call("split_lead", args[0], _q(1))
        for arg in args[1:]:
            heads = self._call("concat", heads, self._call("split_lead", arg, _q(1)), "-3")
        moved = self._call("transpose", heads, _q("0,2,1,3"))
        self.table.commands.append(f"(union {joined} {self._call('merge_heads', moved, _q(len(args)), _q(width))})")
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
        if len(ends) != 1 or int(steps.reshape(-1)[0]) != 1 or not -rank <= int(axes.reshape(-1)[0]) < rank:
            return None
        axis = int(axes.reshape(-1)[0]) % rank - rank
        (start,), (end,) = starts, ends
        whole = shape[axis]
        to_end = end is not None and ((end.static is not None and end.static >= 2**31 - 1) or end == whole)
        if start is None or (end is None and not to_end):
            return None
        if start.static is not None and whole is not None and whole.static is not None and end.static is not None:
            first = min(max(start.static + (whole.static if start.static < 0 else 0), 0), whole.static)
            last = min(max(end.static + (whole.static if end.static < 0 else 0), 0), whole.static)
            piece = self._piece(ins[0], arg, axis, first, max(last - first, 0))
            cut = None
            if axis == -1 and first == 0 < last < whole.static and end.static >= 0:  # a prefix, cut at its end
                cut, bound, at = self._call("cols_before", arg, _q(last)), ins[2], last
            elif axis == -1 and 0 < first == start.static and last == whole.static:  # the rest, from its start
                cut, bound, at = self._call("cols_from", arg, _q(first)), ins[1], first
            if cut is not None:
                self.table.cuts.setdefault(str(at), bound)
                self.table.commands.append(f"(union {piece} {cut})")
            return piece
        if axis != -1:
            return None
        if start == Dim(0) and end.static is None:
            self.table.cuts.setdefault(str(end), ins[2])
            return self._call("cols_before", arg, _q(end))
        if start.static is None and to_end:
            self.table.cuts.setdefault(str(start), ins[1])
            return self._call("cols_from", arg, _q(start))
        return None

    def _elements(self, value: ir.Value) -> tuple[Dim | None, ...] | None:
        """A 1-D int tensor's elements as dims: constants, or sizes read off shapes (``Shape(k)[2]``)."""
        const = self.facts.const(value)
        if const is not None and np.issubdtype(const.dtype, np.integer):
            return tuple(Dim(int(v)) for v in const.reshape(-1))
        return self.facts.elems(value)

    def _unit_heads_axis(self, node: ir.Node, arg: str) -> str | None:
        """Squeezing the unit axis 1 of a rank-4 tensor merges it into the batch, unsqueezing axis 1 of a rank-3
        one splits a unit axis off it: per-head attention's (B, 1, S, H) ↔ (B, S, H)."""
        axes = _axes(node, self.facts)
        rank = self.facts.rank(node.inputs[0])
        if axes is None or len(axes) != 1 or rank is None:
            return None
        if node.op_type == "Squeeze" and rank == 4 and axes[0] % 4 == 1:
            shape = self.facts.shape(node.inputs[0])
            return self._call("merge_lead", arg, _q(1)) if shape is not None and shape[1] == Dim(1) else None
        if node.op_type == "Unsqueeze" and rank == 3 and axes[0] % 4 == 1:
            return self._call("split_lead", arg, _q(1))
        return None

    def _einsum_permutation(self, node: ir.Node, arg: str) -> str | None:
        """A one-operand Einsum that only reorders axes (``ijbn->bnij``) is a Transpose."""
        equation = node.attributes["equation"].value.replace(" ", "")
        if "..." in equation or "->" not in equation:
            return None
        have, want = equation.split("->")
        if "," in have or sorted(have) != sorted(want) or len(set(have)) != len(have):
            return None
        return self._permuted(arg, have, list(want))

    def _conv1x1(self, node: ir.Node, args: list[str | None]) -> str | None:
        """A 1×1 ``Conv`` on (B, C, S) is a projection of the channels: ``(xᵀ @ Wᵀ + b)ᵀ`` with W (C', C, 1)
        read as the (C, C') matrix it is, so the projection rules (bias, packing) see an ordinary MatMul."""
        weight = self.facts.weight(node.inputs[1])
        shape = self.facts.shape(node.inputs[0])
        if weight is None or weight.ndim != 3 or weight.shape[2] != 1 or shape is None or len(shape) != 3:
            return None
        attrs = {name: a.value for name, a in node.attributes.items()}
        if int(attrs.get("group", 1)) != 1 or str(attrs.get("auto_pad", "NOTSET")) not in ("NOTSET", "VALID"):
            return None
        if any(int(v) != 1 for key in ("strides", "dilations", "kernel_shape") for v in attrs.get(key, [1])):
            return None
        if any(int(v) != 0 for v in attrs.get("pads", [0])):
            return None
        matrix = self._call("merge_heads", args[1], _q(weight.shape[1]), _q(1))  # (C', C, 1) → (C', C)
        product = self._call("matmul", self._call("transpose", args[0], _q("0,2,1")),
                             self._call("transpose", matrix, _q("1,0")))  # fmt: skip
        if len(args) > 2 and args[2] is not None:
            product = self._call("add", product, args[2])
        return self._call("transpose", product, _q("0,2,1"))

    def _einsum(self, node: ir.Node, args: list[str | None]) -> str | None:
        """A two-operand Einsum that is a (batched) MatMul, written with transposes and reshape meanings."""
        equation = node.attributes["equation"].value.replace(" ", "")
        if "..." in equation or "->" not in equation:
            return None
        lhs, out = equation.split("->")
        terms = lhs.split(",")
        if len(terms) != 2 or any(len(set(t)) != len(t) for t in (*terms, out)):
            return None
        a, b = terms
        batch = [c for c in out if c in a and c in b]
        contract = [c for c in a if c in b and c not in out]
        m = [c for c in a if c not in b and c in out]
        n = [c for c in b if c not in a and c in out]
        if set(a) != set(batch + contract + m) or set(b) != set(batch + contract + n) or not contract:
            return None
        shape_b = self.facts.shape(node.inputs[1])
        dims = dict(zip(b, shape_b, strict=True)) if shape_b is not None and len(shape_b) == len(b) else {}

        def static(c: str) -> str | None:
            d = dims.get(c)
            return None if d is None or d.static is None else str(d.static)

        left = self._permuted(args[0], a, batch + m + contract)
        right = self._permuted(args[1], b, batch + contract + n)
        if len(contract) == 2 and not batch and static(contract[1]):  # (…, c, d) @ (c, d, e): merge c·d
            left = self._call("merge_heads", left, _q(static(contract[0]) or "?"), _q(static(contract[1])))
            right = self._call("merge_lead", right, _q(static(contract[1])))
        elif len(contract) != 1:
            return None
        if len(n) == 2 and not batch and static(n[0]) and static(n[1]):  # (…, c) @ (c, d, e): split d, e
            product = self._call("matmul", left, self._call("merge_heads", right, _q(static(n[0])), _q(static(n[1]))))
            result, order = self._call("split_heads", product, _q(static(n[0])), _q(static(n[1]))), batch + m + n
        elif len(n) == 1 and len(m) >= 1 and (len(m) == 1 or not batch):
            result, order = self._call("matmul", left, right), batch + m + n
        else:
            return None
        return self._permuted(result, "".join(order), list(out))

    def _permuted(self, term: str, have: str, want: list[str]) -> str:
        perm = [have.index(c) for c in want]
        return term if perm == sorted(perm) else self._call("transpose", term, _q(perm_string(perm)))

    def _kept_whole(self, value: ir.Value) -> ir.Value:
        """``value`` before the Identity nodes and whole-tensor Slices (``x[:, :, None, :, :]`` in torch 2.1's
        repeat_kv: every axis sliced ``0:MAX:1``) that lead to it: the same tensor."""
        node = value.producer()
        while node is not None and node.inputs and node.inputs[0] is not None:
            if node.op_type == "Slice":
                steps = self.facts.const(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else 1
                src, out = self.facts.shape(node.inputs[0]), self.facts.shape(node.outputs[0])
                whole = src is not None and src == out and None not in src and np.all(np.asarray(steps) == 1)
                if not whole:
                    break
            elif node.op_type != "Identity":
                break
            value = node.inputs[0]
            node = value.producer()
        return value

    def _repeat_heads(self, node: ir.Node, dst: tuple) -> str | None:
        """``Reshape(Expand(Unsqueeze(x, 2)), (B, N·r, T, H))``: repeat_kv, read as one meaning."""
        expand = self._kept_whole(node.inputs[0]).producer()
        if expand is None or expand.op_type != "Expand" or len(dst) != 4:
            return None
        unsqueeze = self._kept_whole(expand.inputs[0]).producer()
        if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or _axes(unsqueeze, self.facts) != [2]:
            return None
        x = unsqueeze.inputs[0]
        src, wide = self.facts.shape(x), self.facts.shape(expand.outputs[0])
        if src is None or wide is None or len(src) != 4 or len(wide) != 5 or None in src or None in wide:
            return None
        times = wide[2]
        if wide[:2] != src[:2] or wide[3:] != src[2:] or times.static is None:
            return None
        if dst[0] != src[0] or dst[2:] != src[2:] or dst[1] != src[1] * times:
            return None
        return self._call("repeat_heads", self._arg(x, self._inside), _q(times.static))

    def _expand(self, node: ir.Node, arg: str) -> str | None:
        """An Expand to the shape its input already has is the identity (dynamo's batched MatMul writes one
        before each 3D reshape); one that broadcasts stays opaque (repeat_kv reads it through its Reshape)."""
        src, dst = self.facts.shape(node.inputs[0]), self.facts.shape(node.outputs[0])
        if src is None or dst is None or None in src or src != dst:
            return None
        return arg

    def _is_constant(self, value: ir.Value | None) -> bool:
        return value is not None and (self.facts.const(value) is not None or value.const_value is not None)

    def _softmax(self, node: ir.Node, arg: str) -> str | None:
        rank = self.facts.rank(node.inputs[0])
        default = -1 if self.opset >= 13 else 1
        axis = node.attributes.get("axis")
        axis = default if axis is None else axis.value
        if axis != -1 and (rank is None or axis % rank != rank - 1):  # -1 is the last axis whatever the rank
            return None
        return self._call("softmax", arg)

    def _reshape(self, node: ir.Node, args: list[str | None]) -> str | None:
        """Read a Reshape as the layout change it performs, from the symbolic in/out shapes.

        Unknown input dims become placeholder symbols, so a dim the spec copies (0) or infers (-1) is still
        provably equal to its source even when nobody knows its size."""
        generic = self._call("reshape", args[0], args[1])
        src = self.facts.shape(node.inputs[0])
        if not src:  # unknown, or a scalar (no layout to read)
            return generic
        src = tuple(
            d if d is not None else Dim(1, (f"?{self.table.id_of(node.inputs[0])}_{i}",)) for i, d in enumerate(src)
        )
        spec = self.facts.reshape_spec(node)
        allowzero = bool(node.attributes["allowzero"].value) if "allowzero" in node.attributes else False
        dst = reshape_result(src, spec, allowzero) if spec is not None else self.facts.shape(node.outputs[0])
        if dst is None or any(d is None for d in dst):
            return generic
        if src == dst:
            return args[0]
        repeated = self._repeat_heads(node, dst)
        if repeated is not None:
            return repeated
        if len(dst) == len(src) + 1 and dst[:-2] == src[:-1] and _mul(dst[-2], dst[-1]) == src[-1]:
            return self._call("split_heads", args[0], _q(dst[-2]), _q(dst[-1]))
        if len(dst) == len(src) - 1 and dst[:-1] == src[:-2] and _mul(src[-2], src[-1]) == dst[-1]:
            return self._call("merge_heads", args[0], _q(src[-2]), _q(src[-1]))
        if len(dst) == len(src) - 1 and dst[1:] == src[2:] and _mul(src[0], src[1]) == dst[0]:
            return self._call("merge_lead", args[0], _q(src[1]))
        if len(dst) == len(src) + 1 and dst[2:] == src[1:] and _mul(dst[0], dst[1]) == src[0]:
            return self._call("split_lead", args[0], _q(dst[1]))
        if len(src) == 3 and len(dst) == 4 and dst[0] == src[0] and dst[3] == src[2] and _mul(dst[1], dst[2]) == src[1]:
            # (B, N·H, S) → (B, N, H, S): a head split of the channel axis, i.e. of the last axis of (B, S, C)
            moved = self._call("split_heads", self._call("transpose", args[0], _q("0,2,1")), _q(dst[1]), _q(dst[2]))
            return self._call("transpose", moved, _q("0,2,3,1"))
        if len(src) == 4 and len(dst) == 3 and dst[0] == src[0] and dst[2] == src[3] and _mul(src[1], src[2]) == dst[1]:
            # (B, N, H, S) → (B, N·H, S): the channel-first merge of the heads
            moved = self._call("merge_heads", self._call("transpose", args[0], _q("0,3,1,2")), _q(src[1]), _q(src[2]))
            return self._call("transpose", moved, _q("0,2,1"))
        return generic


def _axes(node: ir.Node, facts: GraphFacts) -> list[int] | None:
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = facts.const(node.inputs[1])
        return None if axes is None else [int(a) for a in axes.reshape(-1)]
    attr = node.attributes.get("axes")
    return None if attr is None else list(attr.value)


def _mul(a: Dim | None, b: Dim | None) -> Dim | None:
    return product((a, b))


def _required_inputs(op: str) -> int:
    required = {"Where": 3, "Reshape": 2, "MatMul": 2, "Add": 2, "Sub": 2, "Mul": 2, "Div": 2, "Expand": 2, "Slice": 3}
    return required.get(op, 1)
