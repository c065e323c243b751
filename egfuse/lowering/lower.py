"""ONNX region → e-graph terms.

Each ONNX value of a region gets an id; a value computed inside the region is ``(ref id)`` unioned with the
term for its producer, a value from outside (or a known constant) is the leaf ``(value id)``. Facts the rules
condition on (rank, scalar value, weight, finiteness) are set on the e-classes here. Reshapes are read
through symbolic shapes into what they mean (``split_heads`` …), so rules never need shapes themselves.
Commutative operands are put in canonical order (constant second), instead of general AC rules.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from egfuse.egraph.perms import perm_string
from egfuse.kinds.regions import Region, is_inference_dropout
from egfuse.lowering.lower_layout import LayoutTerms
from egfuse.lowering.lower_pieces import PieceTerms
from egfuse.lowering.lower_terms import Lowered, axes_input, float_text, quoted

__all__ = ["Lowered", "Lowerer"]


class Lowerer(LayoutTerms, PieceTerms):
    """Lowers regions one by one into a shared :class:`Lowered` table: the op dispatch lives here, the op
    families' terms in their own modules."""

    @property
    def _rotary_heads(self) -> set[str]:
        return {self.n[name] for name in _ROTARY_TERMS}

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
            spread = node.op_type in ("Expand", "Tile") and term != args[0]  # a pair axis: Concat(a, a)
            if spread or term.split(" ", 1)[0][1:] in self._rotary_heads:
                # Ops only rotations are proven through (a table's Cos, Gather, Unsqueeze …): the graph's own value
                # stays readable, so every other region reads it as before.
                self.table.commands.append(f"(union {ref} {self._leaf(out)})")
            if node.op_type == "Concat" and out in escaping:
                # A join the graph keeps anyway (a KV cache's present output): reading it costs nothing more.
                self.table.commands.append(f"(union {ref} {self._leaf(out)})")

    def _term(self, node: ir.Node, args: list[str | None]) -> str | None:
        """The term for ``node`` (its inputs lowered to ``args``), or None for an op form the rules do not know."""
        op = node.op_type
        if len(args) < _required_inputs(op) or any(a is None for a in args[: _required_inputs(op)]):
            return None  # an input missing: not the op the rules know
        build = _TERMS.get(op)
        return None if build is None else build(self, node, args)

    def _commutative(self, node: ir.Node, args: list[str | None]) -> str | None:
        """``Add``, ``Mul`` and two-input ``Max`` with the constant operand second: commutation as one spelling."""
        if node.op_type == "Max" and len(args) != 2:
            return None
        a, b = args[0], args[1]
        if self._is_constant(node.inputs[0]) and not self._is_constant(node.inputs[1]):
            a, b = b, a  # canonical order: the constant operand second
        return self._call("maximum" if node.op_type == "Max" else node.op_type.lower(), a, b)

    def _cast(self, node: ir.Node, args: list[str | None]) -> str | None:
        to = int(node.attributes["to"].value)
        source = node.inputs[0]
        if source.dtype is not None and int(source.dtype) == to:
            return args[0]  # a cast to the dtype it already has is the identity
        negated = self._negated_flag(source, to)
        return negated or self._call("cast", args[0], str(to))

    def _cast_like(self, node: ir.Node, args: list[str | None]) -> str | None:
        """A Cast to the like-operand's dtype (torch 2.1's softmax ends in one)."""
        source, like = node.inputs[0], node.inputs[1]
        if like is None or like.dtype is None:
            return None
        to = int(like.dtype)
        if source.dtype is not None and int(source.dtype) == to:
            return args[0]
        return self._call("cast", args[0], str(to))

    def _transpose(self, node: ir.Node, args: list[str | None]) -> str | None:
        rank = self.facts.rank(node.inputs[0])
        perm_attr = node.attributes.get("perm")
        if perm_attr is None and rank is None:
            return None
        perm = list(perm_attr.value) if perm_attr is not None else list(reversed(range(rank)))
        return self._call("transpose", args[0], quoted(perm_string(perm)))

    def _einsum_any(self, node: ir.Node, args: list[str | None]) -> str | None:
        """A two-operand Einsum (a product) or a one-operand one (a permutation)."""
        if len(args) == 2:
            return self._einsum(node, args)
        if len(args) == 1:
            return self._einsum_permutation(node, args[0])
        return None

    def _squeezed(self, node: ir.Node, arg: str) -> str | None:
        """A unit axis taken out or put in, and — where it ends a chain of views — what the whole chain means
        (``Squeeze(Reshape(y, (B, N, T, 1, H)))`` is ``split_lead`` of the (B·N, T, H) y): both terms, one e-class."""
        term = self._unit_heads_axis(node, arg)
        dst = self.facts.shape(node.outputs[0])
        if dst is None or any(d is None for d in dst):
            return term
        return self._one_class(term, self._through_views(node, tuple(dst)))

    def _negated_flag(self, value: ir.Value, to: int) -> str | None:
        """``Cast(Not(m), float)`` as ``1 − Cast(m, float)``: a select written as arithmetic on its flags
        (tf2onnx lowers SelectV2 to ``m·a + ¬m·b``) then reads as the product form of a mask."""
        node = value.producer()
        floating = ir.DataType(to).is_floating_point()
        if node is None or node.op_type != "Not" or not floating:
            return None
        flag = self._arg(node.inputs[0], self._inside)
        if flag is None:
            return None
        cast = self._call("cast", flag, str(to))
        return self._call("sub", self._call("full_like", cast, float_text(1.0)), cast)

    def _last_axis(self, node: ir.Node, arg: str, term: str) -> str | None:
        """A reduction over the last axis, kept, as ``term``: a norm's mean (``reduce_mean``), the max a stable
        softmax subtracts (``row_max``); any other reduction is not a term the rules know."""
        rank = self.facts.rank(node.inputs[0])
        keep = node.attributes.get("keepdims")
        axes = axes_input(node, self.facts)
        if (keep is not None and keep.value != 1) or rank is None or axes is None or len(axes) != 1:
            return None
        return self._call(term, arg) if axes[0] % rank == rank - 1 else None

    def _global_average(self, node: ir.Node, arg: str) -> str | None:
        """``GlobalAveragePool`` averages every axis after the second: of a rank-3 tensor, the last one, kept —
        the mean of a norm as Keras' exporters write it."""
        return self._call("reduce_mean", arg) if self.facts.rank(node.inputs[0]) == 3 else None

    def _layer_norm(self, node: ir.Node, args: list[str | None]) -> str | None:
        """The op itself over the last axis, its mean and deviation outputs unread: the term the rules build."""
        rank = self.facts.rank(node.inputs[0])
        axis = node.attributes.get("axis")
        axis = -1 if axis is None else axis.value
        if (axis != -1 and (rank is None or axis % rank != rank - 1)) or any(o.uses() for o in node.outputs[1:]):
            return None
        eps = node.attributes.get("epsilon")
        bias = args[2] if len(args) > 2 and args[2] is not None else self._call("zero_bias", args[1])
        return self._call("layer_norm", args[0], args[1], bias, float_text(1e-5 if eps is None else eps.value))

    def _softmax(self, node: ir.Node, arg: str) -> str | None:
        rank = self.facts.rank(node.inputs[0])
        default = -1 if self.opset >= 13 else 1
        axis = node.attributes.get("axis")
        axis = default if axis is None else axis.value
        if axis != -1 and (rank is None or axis % rank != rank - 1):  # -1 is the last axis whatever the rank
            return None
        return self._call("softmax", arg)


_TermBuilder = Callable[[Lowerer, ir.Node, list[str | None]], str | None]

_UNARY = ("IsNaN", "Sqrt", "Tanh", "Reciprocal", "Erf", "Neg", "Cos", "Sin")
_BINARY = ("Sub", "Div", "MatMul", "Pow")

_TERMS: dict[str, _TermBuilder] = {
    **{op: Lowerer._commutative for op in ("Max", "Add", "Mul")},
    **{op: lambda self, node, args: self._call(node.op_type.lower(), args[0], args[1]) for op in _BINARY},
    **{op: lambda self, node, args: self._call(node.op_type.lower(), args[0]) for op in _UNARY},
    "Where": lambda self, node, args: self._call("where", *args[:3]),
    "Dropout": lambda self, node, args: args[0] if is_inference_dropout(node, self.facts) else None,
    "Identity": lambda self, node, args: args[0],
    "Expand": lambda self, node, args: self._expand(node, args[0]),
    "Gather": lambda self, node, args: self._rows(node, args),
    "GatherND": lambda self, node, args: self._rows_nd(node, args),
    "Tile": lambda self, node, args: self._tile(node, args[0]),
    "ReduceMean": lambda self, node, args: self._last_axis(node, args[0], "reduce_mean"),
    "ReduceMax": lambda self, node, args: self._last_axis(node, args[0], "row_max"),
    "GlobalAveragePool": lambda self, node, args: self._global_average(node, args[0]),
    "LayerNormalization": lambda self, node, args: (
        self._layer_norm(node, args) if len(args) > 1 and args[1] is not None else None
    ),
    "Cast": Lowerer._cast,
    "CastLike": Lowerer._cast_like,
    "Softmax": lambda self, node, args: self._softmax(node, args[0]),
    "Transpose": Lowerer._transpose,
    "Reshape": lambda self, node, args: self._reshape(node, args),
    "Einsum": Lowerer._einsum_any,
    "Conv": lambda self, node, args: self._conv1x1(node, args),
    "Concat": lambda self, node, args: self._concat(node, args),
    "Slice": lambda self, node, args: self._slice(node, args[0]),
    "Squeeze": lambda self, node, args: self._squeezed(node, args[0]),
    "Unsqueeze": lambda self, node, args: self._squeezed(node, args[0]),
}
"""ONNX op → its term: the ops the rules know, each with the checks its form needs (others are opaque leaves)."""

_ROTARY_TERMS = ("neg", "cos", "sin", "rows", "rows_nd", "strided", "unsqueeze", "sliced")
"""Terms of ops that only rotations are proven through."""


def _required_inputs(op: str) -> int:
    required = {"Where": 3, "Reshape": 2, "MatMul": 2, "Add": 2, "Sub": 2, "Mul": 2, "Div": 2, "Expand": 2, "Slice": 3,
                "Pow": 2, "Gather": 2, "GatherND": 2, "Tile": 2}  # fmt: skip
    return required.get(op, 1)
