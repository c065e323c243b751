"""Terms for layout ops: Reshape read through symbolic shapes into what it means (``split_heads``,
``merge_heads``, ``merge_lead`` …), Einsum and 1×1 Conv as MatMuls with transposes, Expand and GQA's
head repetition — so the rules never look at shapes themselves."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from egfuse.analysis.dims import Dim, reshape_result
from egfuse.egraph.perms import perm_string
from egfuse.lowering.lower_groups import GroupTerms
from egfuse.lowering.lower_terms import axes_input, quoted, times

VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze"})
"""Ops that only view their input in another shape, its elements in the same row-major order."""


class LayoutTerms(GroupTerms):
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
        matrix = self._call("merge_heads", args[1], quoted(weight.shape[1]), quoted(1))  # (C', C, 1) → (C', C)
        product = self._call("matmul", self._call("transpose", args[0], quoted("0,2,1")),
                             self._call("transpose", matrix, quoted("1,0")))  # fmt: skip
        if len(args) > 2 and args[2] is not None:
            product = self._call("add", product, args[2])
        return self._call("transpose", product, quoted("0,2,1"))

    def _einsum(self, node: ir.Node, args: list[str | None]) -> str | None:
        """A two-operand Einsum that is a (batched) MatMul, written with transposes and reshape meanings."""
        equation = node.attributes["equation"].value.replace(" ", "")
        if "..." in equation:
            equation = self._ellipsis_named(equation, node)
        if equation is None or "->" not in equation:
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
            left = self._call("merge_heads", left, quoted(static(contract[0]) or "?"), quoted(static(contract[1])))
            right = self._call("merge_lead", right, quoted(static(contract[1])))
        elif len(contract) != 1:
            return None
        if len(n) == 2 and not batch and static(n[0]) and static(n[1]):  # (…, c) @ (c, d, e): split d, e
            product = self._call(
                "matmul", left, self._call("merge_heads", right, quoted(static(n[0])), quoted(static(n[1])))
            )
            result, order = (
                self._call("split_heads", product, quoted(static(n[0])), quoted(static(n[1]))),
                batch + m + n,
            )
        elif len(n) == 1 and len(m) >= 1 and (len(m) == 1 or not batch):
            result, order = self._call("matmul", left, right), batch + m + n
        else:
            return None
        return self._permuted(result, "".join(order), list(out))

    def _ellipsis_named(self, equation: str, node: ir.Node) -> str | None:
        """``...`` as the leading axes it stands for, each given a letter of its own (``...qhd,...khd->...hqk`` of
        two rank-5 operands is ``ABqhd,ABkhd->ABhqk``: LongT5's blocks): as many in both operands (where their sizes
        differ they broadcast as MatMul's batch axes do), and leading in the output. None where the ranks do not
        say how many."""
        if "->" not in equation:
            return None
        lhs, out = equation.split("->")
        terms = lhs.split(",")
        ranks = [self.facts.rank(v) if v is not None else None for v in node.inputs]
        if len(terms) != 2 or None in ranks or not all(t.startswith("...") for t in (*terms, out)):
            return None
        counts = {rank - (len(term) - 3) for term, rank in zip(terms, ranks, strict=True)}
        free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in equation]
        if len(counts) != 1 or (count := counts.pop()) < 0 or count > len(free):
            return None
        lead = "".join(free[:count])
        return equation.replace("...", lead)

    def _permuted(self, term: str, have: str, want: list[str]) -> str:
        perm = [have.index(c) for c in want]
        return term if perm == sorted(perm) else self._call("transpose", term, quoted(perm_string(perm)))

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
        if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or axes_input(unsqueeze, self.facts) != [2]:
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
        return self._call("repeat_heads", self._arg(x, self._inside), quoted(times.static))

    def _expand(self, node: ir.Node, arg: str) -> str | None:
        """An Expand to the shape its input already has is the identity (dynamo's batched MatMul writes one
        before each 3D reshape); one that broadcasts stays opaque (repeat_kv reads it through its Reshape)."""
        src, dst = self.facts.shape(node.inputs[0]), self.facts.shape(node.outputs[0])
        if src is not None and dst is not None and None not in src and src == dst:
            return arg
        return self._pair_spread(node, arg, src, dst)

    def _tile(self, node: ir.Node, arg: str) -> str | None:
        """A Tile that doubles only the last axis: ``Concat(a, a)`` on it."""
        repeats = self.facts.const(node.inputs[1])
        if repeats is None or [int(r) for r in repeats.reshape(-1)][-1:] != [2] or set(repeats.reshape(-1)[:-1]) - {1}:
            return None
        return self._call("concat", arg, arg, "-1")

    def _pair_spread(self, node: ir.Node, arg: str, src: tuple | None, dst: tuple | None) -> str | None:
        """An Expand of a unit last axis to 2, nothing else broadcast: ``Concat(a, a)`` on it (the pair axis of
        ``repeat_interleave(t, 2)``, which a Reshape then merges)."""
        if src is None or dst is None or len(src) != len(dst) or src[:-1] != dst[:-1] or None in src[:-1]:
            return None
        return self._call("concat", arg, arg, "-1") if (src[-1], dst[-1]) == (Dim(1), Dim(2)) else None

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
        if (
            dst is not None
            and spec is not None
            and len(spec) == len(src) + 1
            and spec[0] == -1
            and dst[1] is not None
            and dst[1].static
            and tuple(dst[2:]) == tuple(src[1:])
        ):  # (-1, W, …the rest of src): W split off the leading dim, whatever the quotient's name (a Reshape
            return self._call("split_lead", args[0], quoted(dst[1]))  # that runs divides it exactly)
        if dst is None or any(d is None for d in dst):
            return generic
        if src == dst:
            return args[0]
        repeated = self._repeat_heads(node, dst)
        if repeated is not None:
            return repeated
        known = self._one_class(self._meaning(args[0], src, dst), self._through_views(node, dst))
        return known or self._view_of_sum(node) or generic

    def _view_of_sum(self, node: ir.Node) -> str | None:
        """``Reshape(Reshape(x, V) + a + b …, shape(x))``: the scores viewed in other axes only to add terms there
        (decomposed relative positions, ViTDet's and SAM's: (B·N, h·w, h·w) viewed as (B·N, h, w, h, w), a
        height term and a width term added, viewed back). A view keeps the elements' order and the terms
        together have the view's full shape, so the view back distributes over the sum: ``x + Reshape(a + b …,
        shape(x))`` — the scores plus one bias the attention op takes. Only where the view back has no layout
        meaning of its own: (B, N, S, T) → (B·N, S, T) is ``merge_lead``, which the heads rules move outward."""
        dst = self.facts.shape(node.outputs[0])
        addends = self._addends(node.inputs[0])
        if dst is None or None in dst or addends is None:
            return None
        views = [(v, source) for v in addends if (source := self._viewed_from(v, tuple(dst))) is not None]
        if len(views) != 1:
            return None
        ((view, source),) = views
        terms = [v for v in addends if v is not view]
        full = self.facts.shape(view)
        if not terms or full is None or None in full or _broadcast([self.facts.shape(v) for v in terms]) != tuple(full):
            return None
        parts = [self._arg(v, self._inside) for v in [source, *terms]]
        if None in parts:
            return None
        total = parts[1]
        for part in parts[2:]:
            total = self._call("add", total, part)
        bias = self._call("reshape", total, self._arg(node.inputs[1], self._inside))
        self._facts(node.outputs[0], bias, leaf=False)  # the bias has the view's shape back: the scores'
        return self._call("add", parts[0], bias)

    def _addends(self, value: ir.Value) -> list[ir.Value] | None:
        """The values a chain of ``Add`` nodes inside the region sums (each Add read only by the next)."""
        node = value.producer()
        if node is None or node.op_type != "Add" or value not in self._inside or len(node.inputs) != 2:
            return None
        found: list[ir.Value] = []
        for operand in node.inputs:
            inner = self._addends(operand) if operand is not None and len(operand.uses()) == 1 else None
            found.extend(inner if inner is not None else [operand])
        return None if None in found else found

    def _viewed_from(self, value: ir.Value, shape: tuple[Dim, ...]) -> ir.Value | None:
        """The tensor of ``shape`` that ``value`` is a Reshape of (inside the region), if it is one."""
        node = value.producer()
        if node is None or node.op_type != "Reshape" or value not in self._inside:
            return None
        source = node.inputs[0]
        return source if source is not None and self.facts.shape(source) == shape else None

    def _through_views(self, node: ir.Node, dst: tuple[Dim, ...]) -> str | None:
        """A chain of views (Reshape, Squeeze, Unsqueeze: each keeps the elements in row-major order) is one
        Reshape of the chain's first input, so the chain's result read from that input's shape may mean what no
        single step does: tf2onnx's Einsum unsqueezes a unit axis and then folds the batch dims,
        (B, N, T, S) → (B, N, T, 1, S) → (B·N, T, S), which is ``merge_lead`` of the first tensor."""
        for arg, src in self._view_origins(node.inputs[0]):
            if src == dst:
                return arg
            meaning = self._meaning(arg, src, dst)
            if meaning is not None:
                return meaning
        return None

    def _view_origins(self, value: ir.Value):
        """(term, shape) of each tensor ``value`` is a view of, nearest first: through views, and through a
        Transpose of an unsqueezed tensor — which moves only a unit axis besides the others, so it is the
        Transpose of the tensor without that axis, viewed (tf2onnx's Einsum: Unsqueeze → Transpose → Reshape)."""
        for _ in range(4):  # the chains exporters write are short
            producer = value.producer()
            if producer is None or value not in self._inside:
                return
            if producer.op_type == "Transpose":
                moved = self._unit_axes_moved(producer)
                if moved is not None:
                    yield moved
                return
            if producer.op_type not in VIEWS:
                return
            value = producer.inputs[0]
            src = self.facts.shape(value)
            arg = self._arg(value, self._inside)
            if arg is not None and src and all(d is not None for d in src):
                yield arg, tuple(src)

    def _unit_axes_moved(self, transpose: ir.Node) -> tuple[str, tuple[Dim, ...]] | None:
        """``Transpose(Unsqueeze(x, U), P)`` as ``transpose(x, P')`` (its result viewed with the unit axes put
        back): P' is P with the unit axes U left out."""
        unsqueeze = transpose.inputs[0].producer()
        if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or transpose.inputs[0] not in self._inside:
            return None
        x = unsqueeze.inputs[0]
        shape, axes, perm = self.facts.shape(x), axes_input(unsqueeze, self.facts), transpose.attributes.get("perm")
        if shape is None or None in shape or axes is None or perm is None:
            return None
        rank = len(shape) + len(axes)
        units = {a % rank for a in axes}
        order = [int(a) for a in perm.value]
        if sorted(order) != list(range(rank)):
            return None
        kept = [a - sum(u < a for u in units) for a in order if a not in units]
        arg = self._arg(x, self._inside)
        if arg is None:
            return None
        moved = arg if kept == sorted(kept) else self._call("transpose", arg, quoted(perm_string(kept)))
        return moved, tuple(shape[a] for a in kept)

    def _meaning(self, arg: str, src: tuple[Dim, ...], dst: tuple[Dim, ...]) -> str | None:
        """The layout change a reshape from ``src`` to ``dst`` performs, as a term on ``arg`` (None: none the
        rules know). Where a unit dim makes two readings true (one KV head: (B, 1, G, T, X) is both the batch
        split by 1 and the heads grouped by G), both are stated: one e-class."""
        return self._one_class(self._plain_meaning(arg, src, dst), self._grouped(arg, src, dst))

    def _plain_meaning(self, arg: str, src: tuple[Dim, ...], dst: tuple[Dim, ...]) -> str | None:
        args = [arg]
        if len(dst) == len(src) + 1 and dst[:-2] == src[:-1] and times(dst[-2], dst[-1]) == src[-1]:
            return self._call("split_heads", args[0], quoted(dst[-2]), quoted(dst[-1]))
        if len(dst) == len(src) - 1 and dst[:-1] == src[:-2] and times(src[-2], src[-1]) == dst[-1]:
            return self._call("merge_heads", args[0], quoted(src[-2]), quoted(src[-1]))
        if len(dst) == len(src) - 1 and dst[1:] == src[2:] and times(src[0], src[1]) == dst[0]:
            return self._call("merge_lead", args[0], quoted(src[1]))
        if len(dst) == len(src) + 1 and dst[2:] == src[1:] and times(dst[0], dst[1]) == src[0]:
            return self._call("split_lead", args[0], quoted(dst[1]))
        if (
            len(src) == 3
            and len(dst) == 4
            and dst[0] == src[0]
            and dst[3] == src[2]
            and times(dst[1], dst[2]) == src[1]
        ):
            # (B, N·H, S) → (B, N, H, S): a head split of the channel axis, i.e. of the last axis of (B, S, C)
            moved = self._call(
                "split_heads", self._call("transpose", args[0], quoted("0,2,1")), quoted(dst[1]), quoted(dst[2])
            )
            return self._call("transpose", moved, quoted("0,2,3,1"))
        if (
            len(src) == 4
            and len(dst) == 3
            and dst[0] == src[0]
            and dst[2] == src[3]
            and times(src[1], src[2]) == dst[1]
        ):
            # (B, N, H, S) → (B, N·H, S): the channel-first merge of the heads
            moved = self._call(
                "merge_heads", self._call("transpose", args[0], quoted("0,3,1,2")), quoted(src[1]), quoted(src[2])
            )
            return self._call("transpose", moved, quoted("0,2,1"))
        return None


def _broadcast(shapes: list) -> tuple[Dim, ...] | None:
    """The shape numpy broadcasting gives ``shapes`` (None where one is unknown or they do not broadcast)."""
    if any(shape is None or None in shape for shape in shapes):
        return None
    rank = max(len(shape) for shape in shapes)
    result = [Dim(1)] * rank
    for shape in shapes:
        for axis, dim in enumerate((Dim(1),) * (rank - len(shape)) + tuple(shape)):
            if dim == result[axis] or dim == Dim(1):
                continue
            if result[axis] != Dim(1):
                return None
            result[axis] = dim
    return tuple(result)
