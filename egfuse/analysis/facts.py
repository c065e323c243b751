"""What is known about each value before lowering: symbolic shapes, dtypes and small constant values.

Exporters compute scales and reshape targets at run time (``Shape → Gather → Cast → Sqrt → Div``,
``Concat(Shape(x)[0], 4, 16)``). Rule conditions need those as facts, so this module evaluates the graph
*abstractly*: small tensors whose inputs are known get their values (:mod:`~egfuse.analysis.fold`), shape vectors get
partially known symbolic elements (:mod:`~egfuse.analysis.shape_vectors`), and the shapes of layout ops ONNX shape
inference lost come from :mod:`~egfuse.analysis.op_shapes`; finiteness and magnitude bounds come from
:mod:`~egfuse.analysis.value_bounds`, over stored tensors read once (:mod:`~egfuse.analysis.weight_summary`). This
class holds the answers and answers the queries (:class:`~egfuse.analysis.fact_queries.FactQueries`) those rules ask.
The graph itself is not changed — the bookkeeping nodes die later if the fused op makes them unused.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx_ir as ir

from egfuse.analysis.dims import Dim, Shape, shape_of
from egfuse.analysis.fold import MAX_CONST_ELEMENTS, NUMPY, attr, result_size
from egfuse.analysis.op_shapes import SAME_SHAPE, output_shape, sharpened
from egfuse.analysis.shape_vectors import symbolic_value
from egfuse.analysis.value_bounds import all_finite, finite_magnitude_bound, magnitude_bound
from egfuse.analysis.weight_summary import Summary, release, summarize

__all__ = ["SAME_SHAPE", "GraphFacts"]


def _memoized(table: dict, value: ir.Value, unknown, compute):
    """``table[value]``, computed once by ``compute(value)``; a value reached again while its own answer is being
    computed (no DAG does that) reads ``unknown``."""
    if value not in table:
        table[value] = unknown
        table[value] = compute(value)
    return table[value]


class GraphFacts:
    """Shapes, dtypes and constant values of a graph's values, by abstract evaluation."""

    def __init__(self, graph: ir.Graph) -> None:
        self.graph = graph
        self._const: dict[ir.Value, np.ndarray] = {}
        self._elems: dict[ir.Value, tuple[Dim | None, ...]] = {}
        self._shape: dict[ir.Value, Shape] = {}
        self._flags: dict[ir.Value, tuple[bool, ...]] = {}  # known boolean vectors (Equal on a shape)
        self._finite: dict[ir.Value, bool] = {}
        self._magnitude: dict[ir.Value, float | None] = {}
        self._finite_magnitude: dict[ir.Value, float | None] = {}
        self._summaries: dict[ir.Value, Summary | None] = {}
        self._read_shapes: dict[ir.Value, tuple[ir.Shape | None, Shape]] = {}
        """A value's shape as read from the graph, by the ``ir.Shape`` it was read from (a value given a new shape
        is read again): lowering asks each value's shape a few times per fact, for every layer's regions."""
        for value in graph.initializers.values():
            self._record_initializer(value)
        for node in graph:
            try:
                self._visit(node)
            except Exception:  # an op we cannot evaluate abstractly just stays unknown
                continue

    # --- queries -------------------------------------------------------------------------------------------
    def const(self, value: ir.Value | None) -> np.ndarray | None:
        return None if value is None else self._const.get(value)

    def weight(self, value: ir.Value | None) -> np.ndarray | None:
        """A constant of any size: an initializer, possibly behind Identity nodes (TorchScript shares equal
        initializers that way), or a small constant this evaluation computed."""
        if value is None:
            return None
        if value.const_value is not None and value.producer() is None:
            return value.const_value.numpy()
        node = value.producer()
        if node is not None and node.op_type in ("Identity", "Transpose") and node.domain in ("", "ai.onnx"):
            source = self.weight(node.inputs[0])
            if source is None or node.op_type == "Identity":
                return source
            perm = attr(node, "perm")
            return np.transpose(source, perm)  # a weight stored transposed (Linear's W, dynamo exports)
        return self.const(value)

    def summary(self, value: ir.Value | None) -> Summary | None:
        """The :class:`Summary` of a stored constant's values (None where ``value`` is no stored or computed
        constant), read once; a weight mapped from its file is unmapped again after (the validation sessions map
        it themselves)."""
        if value is None:
            return None
        if value not in self._summaries:
            array = self.weight(value)
            self._summaries[value] = None if array is None else summarize(array)
            del array
            release(value)
        return self._summaries[value]

    def scalar(self, value: ir.Value | None) -> float | None:
        """The value of a one-element constant of rank ≤ 1 (broadcasts like a scalar onto any operand)."""
        c = self.const(value)
        if c is None or c.size != 1 or c.ndim > 1:
            return None
        return float(c.reshape(-1)[0])

    def truth(self, value: ir.Value | None) -> bool | None:
        """The value of a one-element boolean this evaluation knows (a constant, or a comparison of dims)."""
        c = self.const(value)
        if c is not None:
            return bool(c.reshape(-1)[0]) if c.size == 1 else None
        flags = self._flags.get(value) if value is not None else None
        return flags[0] if flags is not None and len(flags) == 1 else None

    def finite(self, value: ir.Value | None) -> bool:
        """Whether every element of ``value`` is finite, as far as its producers show: finite constants, a
        ``Where`` choosing between finite values, a layout op of one, a bool or a finite float cast to a float
        as wide. A mask built once and shared by every layer is computed outside all regions but the first;
        without this the later regions could not prove it finite, and keep a NaN guard the first one drops.
        Sums and products are followed only through magnitude bounds (two finite fills of ``finfo.min`` add
        up to ``-inf``: their bound does not fit)."""
        return value is not None and _memoized(self._finite, value, False, partial(all_finite, self))

    def magnitude(self, value: ir.Value | None) -> float | None:
        """An upper bound on ``|x|`` over the elements of ``value``, as far as its producers show; None where none
        is known. Integers are bounded by their type, products and sums by their operands' bounds — so an
        ALiBi bias (``slopes · Cast(int32 positions)``, at most 2³¹·|slope|) is finite in float32, while two
        fills of ``finfo.min`` added (2·3.4e38) are not."""
        return None if value is None else _memoized(self._magnitude, value, None, partial(magnitude_bound, self))

    def finite_magnitude(self, value: ir.Value | None) -> float | None:
        """An upper bound on ``|x|`` over the finite elements of ``value`` (:meth:`magnitude` where a −inf fill
        counts as nothing): a causal mask ``Trilu(ConstantOfShape(−inf))`` is 0 or −inf, so adding it to
        another mask term never overflows — either the entry was already −inf or nothing was added."""
        if value is None:
            return None
        return _memoized(self._finite_magnitude, value, None, partial(finite_magnitude_bound, self))

    def elems(self, value: ir.Value | None) -> tuple[Dim | None, ...] | None:
        if value is None:
            return None
        return self._elems.get(value)

    def flags(self, value: ir.Value | None) -> tuple[bool, ...] | None:
        """A boolean vector's elements where this evaluation knows them (an ``Equal`` on a shape vector)."""
        return None if value is None else self._flags.get(value)

    def shape(self, value: ir.Value | None) -> Shape | None:
        if value is None:
            return None
        if value in self._shape:
            return self._shape[value]
        read = value.shape
        seen = self._read_shapes.get(value)
        if seen is not None and seen[0] is read:
            return seen[1]
        inferred = shape_of(value)
        lost = inferred is None or any(d is None or d.invented for d in inferred)
        if lost and value in self._const:  # a value this evaluation computed (a buffer sliced by static sizes)
            return tuple(Dim(int(d)) for d in self._const[value].shape)
        if not lost:
            self._read_shapes[value] = (read, inferred)
        return inferred

    def rank(self, value: ir.Value | None) -> int | None:
        s = self.shape(value)
        return None if s is None else len(s)

    def carry_over(self, old: ir.Value, new: ir.Value) -> None:
        """``new`` computes what ``old`` did (a rewrite put it in ``old``'s place): it inherits what is known."""
        for table in (self._const, self._elems, self._shape, self._flags):
            if old in table:
                table[new] = table[old]

    # --- abstract evaluation -------------------------------------------------------------------------------
    def _record_initializer(self, value: ir.Value) -> None:
        tensor = value.const_value
        if tensor is None or tensor.size > MAX_CONST_ELEMENTS:
            return
        self._set_const(value, tensor.numpy())

    def _set_const(self, value: ir.Value, array: np.ndarray) -> None:
        self._const[value] = array
        if array.ndim <= 1 and np.issubdtype(array.dtype, np.integer):
            # Negative entries are kept: -1 in a reshape target means "infer this dim".
            self._elems[value] = tuple(Dim(int(v)) for v in array.reshape(-1))

    def _visit(self, node: ir.Node) -> None:
        if node.domain in ("", "ai.onnx") and node.op_type == "Split":
            self._visit_split(node)
            return
        if node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
            if node.outputs and node.op_type in SAME_SHAPE:
                self._infer_shape(node, node.op_type, node.outputs[0])
            return
        out = node.outputs[0]
        op = node.op_type
        if op == "Constant":
            self._visit_constant(node, out)
            return
        ins = [self.const(v) if v is not None else None for v in node.inputs]
        known = all(c is not None or v is None for c, v in zip(ins, node.inputs, strict=True))
        if known and op in NUMPY and ins and result_size(op, ins) <= MAX_CONST_ELEMENTS:
            with np.errstate(all="ignore"):  # log(0) → −inf, as onnxruntime computes it: no warning for the user
                result = NUMPY[op](node, ins)
            if result is not None and np.size(result) <= MAX_CONST_ELEMENTS:
                self._set_const(out, np.asarray(result))
                return
        self._visit_symbolic(node, op, out)

    def _visit_split(self, node: ir.Node) -> None:
        """A packed QKV projection split in equal parts (GPT-2's ``c_attn``): each part keeps the input's dims
        but the split axis, where shape inference invents a new name for every output."""
        shape = self.shape(node.inputs[0])
        if shape is None or not shape:
            return
        axis = int(attr(node, "axis", 0)) % len(shape)
        sizes = self.const(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if sizes is None and attr(node, "split") is not None:
            sizes = np.asarray(attr(node, "split"))
        parts: list[Dim | None]
        if sizes is not None:
            parts = [Dim(int(size)) for size in np.asarray(sizes).reshape(-1)]
        else:
            whole = shape[axis]
            part = None if whole is None else whole.div(Dim(len(node.outputs)))
            parts = [part] * len(node.outputs)
        if len(parts) != len(node.outputs):
            return
        for out, part in zip(node.outputs, parts, strict=True):
            result = tuple(part if i == axis else d for i, d in enumerate(shape))
            self._shape[out] = sharpened(self.shape(out), result)
        self._fold_split(node, axis, parts)

    def _fold_split(self, node: ir.Node, axis: int, parts: list[Dim | None]) -> None:
        """The pieces of a small constant split at static sizes are constants too (timm's EVA stores its sin and
        cos tables side by side and splits them: the pieces' values are what the rotation's proof reads)."""
        whole = self.const(node.inputs[0])
        if whole is None or any(p is None or p.static is None for p in parts):
            return
        sizes = [p.static for p in parts]
        if axis >= whole.ndim or sum(sizes) != whole.shape[axis]:
            return
        for out, piece in zip(node.outputs, np.split(whole, np.cumsum(sizes)[:-1], axis=axis), strict=True):
            self._set_const(out, piece)

    def _visit_constant(self, node: ir.Node, out: ir.Value) -> None:
        for name in ("value", "value_float", "value_floats", "value_int", "value_ints"):
            attr = node.attributes.get(name)
            if attr is None:
                continue
            if name == "value":
                self._set_const(out, attr.value.numpy())
            elif name.startswith("value_float"):
                self._set_const(out, np.asarray(attr.value, np.float32))
            else:
                self._set_const(out, np.asarray(attr.value, np.int64))

    def _visit_symbolic(self, node: ir.Node, op: str, out: ir.Value) -> None:
        """Shape vectors with symbolic entries (:mod:`egfuse.analysis.shape_vectors`), and shapes of the layout ops
        shape inference missed; a constant computed outright needs no shape."""
        found = symbolic_value(self, node, op)
        if found is not None and found.const is not None:
            self._set_const(out, found.const)
            return
        if found is not None and found.elems is not None:
            self._set_elems(out, found.elems)
        if found is not None and found.flags is not None:
            self._flags[out] = found.flags
        self._infer_shape(node, op, out)

    def _set_elems(self, value: ir.Value, items: tuple[Dim | None, ...]) -> None:
        self._elems[value] = items
        if all(d is not None and d.static is not None for d in items) and items:
            array = np.array([d.static for d in items], np.int64)
            rank = self.rank(value)
            self._const[value] = array.reshape(()) if rank == 0 and array.size == 1 else array

    def reshape_spec(self, node: ir.Node) -> tuple[Dim | int | None, ...] | None:
        """A Reshape's target as literal ints (0 = copy, -1 = infer) where constant, else symbolic elements."""
        spec_const = self.const(node.inputs[1])
        if spec_const is not None:
            return tuple(int(v) for v in spec_const.reshape(-1))
        return self.elems(node.inputs[1])

    def _infer_shape(self, node: ir.Node, op: str, out: ir.Value) -> None:
        """Fill or sharpen the shapes attention layouts need. ONNX shape inference invents a fresh symbol
        (``unk__N``) wherever it loses track (broadcasting two symbolic dims, a Reshape target computed from
        ``Shape``); a dim computed from the inputs wins over such a symbol."""
        known = self.shape(out)
        if known is not None and all(d is not None and not d.invented for d in known):
            return
        result = output_shape(self, node, op)
        if result is not None:
            self._shape[out] = sharpened(known, result)
