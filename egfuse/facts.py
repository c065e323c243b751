"""What is known about each value before lowering: symbolic shapes, dtypes and small constant values.

Exporters compute scales and reshape targets at run time (``Shape → Gather → Cast → Sqrt → Div``,
``Concat(Shape(x)[0], 4, 16)``). Rule conditions need those as facts, so this module evaluates the graph
*abstractly*: small tensors whose inputs are known get their values (:mod:`~egfuse.fold`), shape vectors get
partially known symbolic elements, and the shapes of layout ops ONNX shape inference lost come from
:mod:`~egfuse.op_shapes`. The graph itself is not changed — the bookkeeping nodes die later if the fused op
makes them unused.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_ir as ir

from egfuse.dims import Dim, Shape, product, shape_of
from egfuse.fold import MAX_CONST_ELEMENTS, NUMPY, attr, result_size, slice_values
from egfuse.op_shapes import SAME_SHAPE, output_shape, sharpened

__all__ = ["SAME_SHAPE", "GraphFacts"]


def _add(a: Dim | None, b: Dim | None, subtract: bool) -> Dim | None:
    """A sum of two sizes where it is a size already named: numbers, a zero term, or terms that cancel
    (``s1 + (s1 - s1)·1`` is ``s1``: torch's mask code). A new sum (``past + seq``) stays unknown: the
    exporter has its own name for that length (``total``), and two names for one size would disagree."""
    if a is None or b is None:
        return None
    if b.static == 0:
        return a
    if a.static == 0 and not subtract:
        return b
    total = a.plus(b, -1 if subtract else 1)
    return None if total.summed else total


def _same_dim(a: Dim | None, b: Dim | None) -> bool | None:
    """Whether two dims are equal: the same dim, or two different numbers; ``None`` where that is not known."""
    if a is None or b is None:
        return None
    if a == b:
        return True
    return False if a.static is not None and b.static is not None else None


def _extreme(a: Dim | None, b: Dim | None, larger: bool) -> Dim | None:
    """The larger (smaller) of two sizes where it is known: equal dims, or two numbers."""
    if a is None or b is None:
        return None
    if a == b:
        return a
    if a.static is not None and b.static is not None:
        return Dim(max(a.static, b.static) if larger else min(a.static, b.static))
    return None


def _uniform(array: np.ndarray | None) -> float | None:
    """The one value of a constant whose elements are all equal."""
    if array is None or array.size == 0 or not np.all(array == array.reshape(-1)[0]):
        return None
    return float(array.reshape(-1)[0])


_FINITE_LAYOUT = frozenset(
    {"Identity", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Transpose", "Slice", "Gather", "Flatten", "Tile"}
)
"""Ops that only move, copy or select elements: a result of finite elements has finite elements."""


@dataclass(frozen=True)
class Summary:
    """What the facts ask of a stored tensor's values, read in one pass: all finite, the largest finite
    magnitude (0 for none), the largest magnitude (None where some element is not finite), whether its two
    halves along the last axis are equal (a RoPE table stored with its halves repeated)."""

    finite: bool
    finite_bound: float | None
    bound: float | None
    halves_repeat: bool


_CHUNK_ELEMENTS = 1 << 22
"""Rows read at a time when summarising a stored tensor: its temporaries stay a few MB whatever its size."""


_NON_NUMERIC = Summary(finite=False, finite_bound=None, bound=None, halves_repeat=False)
"""A string or other non-numeric constant: nothing is known of its values."""


def summarize(array: np.ndarray) -> Summary:
    """``array``'s :class:`Summary`, read in chunks of rows: a weight mapped from a file is never copied whole
    (``np.abs`` of a 2 GB projection would be another 2 GB)."""
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == ml_dtypes.bfloat16):
        return _NON_NUMERIC
    rows = array.reshape(-1, array.shape[-1]) if array.ndim >= 1 and array.size else array.reshape(1, -1)
    half = rows.shape[1] // 2 if rows.shape[1] % 2 == 0 and rows.shape[1] > 0 else 0
    step = max(1, _CHUNK_ELEMENTS // max(1, rows.shape[1]))
    finite, largest, halves = True, 0.0, bool(half) and np.issubdtype(array.dtype, np.floating)
    for start in range(0, rows.shape[0], step):
        chunk = np.asarray(rows[start : start + step], np.float64)
        mask = np.isfinite(chunk)
        finite = finite and bool(mask.all())
        if mask.any():
            largest = max(largest, float(np.max(np.abs(chunk[mask]))))
        halves = halves and bool(np.array_equal(chunk[:, :half], chunk[:, half:]))
        del chunk, mask
    return Summary(finite, largest, largest if finite else None, halves)


def _release(value: ir.Value) -> None:
    """Unmap ``value``'s data if it was mapped from a file (read again, mapped again, on the next use)."""
    node = value.producer()
    while node is not None and node.op_type in ("Identity", "Transpose") and node.inputs:
        value, node = node.inputs[0], node.inputs[0].producer()
    if isinstance(value.const_value, ir.ExternalTensor):
        with contextlib.suppress(BufferError):  # a view of it is still held somewhere: it stays mapped
            value.const_value.release()


def _memoized(table: dict, value: ir.Value, unknown, compute):
    """``table[value]``, computed once by ``compute(value)``; a value reached again while its own answer is being
    computed (no DAG does that) reads ``unknown``."""
    if value not in table:
        table[value] = unknown
        table[value] = compute(value)
    return table[value]


def _element_type(value: ir.Value, depth: int = 8) -> ir.DataType | None:
    """``value``'s element type; where shape inference left it unset, a Cast's target or the type of the first
    typed input of the elementwise op that made it."""
    if value.dtype not in (None, ir.DataType.UNDEFINED):
        return value.dtype
    node = value.producer()
    if node is None or depth == 0:
        return None
    if node.op_type == "Cast":
        return ir.DataType(attr(node, "to"))
    for x in node.inputs:
        found = _element_type(x, depth - 1) if x is not None else None
        if found is not None:
            return found
    return None


def _fits(bound: float | None, dtype: ir.DataType | None) -> bool:
    """A float type holds every value of magnitude at most ``bound`` (rounding never reaches infinity)."""
    if bound is None or dtype is None or not dtype.is_floating_point():
        return False
    return bound < float(ml_dtypes.finfo(dtype.numpy()).max)  # ml_dtypes: bfloat16 and float8 too


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
            _release(value)
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
        return value is not None and _memoized(self._finite, value, False, self._is_finite)

    def _is_finite(self, value: ir.Value) -> bool:
        summary = self.summary(value)  # bfloat16 too: ml_dtypes gives it isfinite, though it is no np.number
        if summary is not None:
            return summary.finite
        node = value.producer()
        if node is None or node.domain not in ("", "ai.onnx"):
            return False
        op, inputs = node.op_type, node.inputs
        if op == "Where":
            return self.finite(inputs[1]) and self.finite(inputs[2])
        if op in _FINITE_LAYOUT:
            return self.finite(inputs[0])
        if op == "Concat":
            return all(self.finite(x) for x in inputs)
        if op == "Cast":
            source, target = inputs[0].dtype, ir.DataType(attr(node, "to"))
            if source is None or not target.is_floating_point():
                return False
            if source == ir.DataType.BOOL:
                return True
            if source.is_floating_point() and source.itemsize <= target.itemsize and self.finite(inputs[0]):
                return True
        return _fits(self.magnitude(value), _element_type(value))

    def magnitude(self, value: ir.Value | None) -> float | None:
        """An upper bound on ``|x|`` over the elements of ``value``, as far as its producers show; None where none
        is known. Integers are bounded by their type, products and sums by their operands' bounds — so an
        ALiBi bias (``slopes · Cast(int32 positions)``, at most 2³¹·|slope|) is finite in float32, while two
        fills of ``finfo.min`` added (2·3.4e38) are not."""
        return None if value is None else _memoized(self._magnitude, value, None, self._bound)

    def _bound(self, value: ir.Value) -> float | None:
        dtype = value.dtype
        if dtype == ir.DataType.BOOL:
            return 1.0
        if dtype is not None and dtype.is_integer():
            info = np.iinfo(dtype.numpy())
            return float(max(abs(int(info.min)), int(info.max)))
        summary = self.summary(value)
        if summary is not None:
            return summary.bound
        node = value.producer()
        if node is None or node.domain not in ("", "ai.onnx") or not node.inputs:
            return None
        op, inputs = node.op_type, node.inputs
        if op == "Cast":
            bound = self.magnitude(inputs[0])
            return bound if _fits(bound, _element_type(value)) else None
        if op in _FINITE_LAYOUT or op in ("Neg", "Abs", "Relu"):
            return self.magnitude(inputs[0])
        parts = [inputs[1], inputs[2]] if op == "Where" and len(inputs) == 3 else list(inputs)
        bounds = [self.magnitude(x) for x in parts]
        if any(b is None for b in bounds) or op not in ("Where", "Concat", "Max", "Min", "Mul", "Add", "Sub"):
            return None
        if op == "Mul":
            return float(np.prod(bounds))
        if op in ("Add", "Sub"):
            return float(sum(bounds))
        return max(bounds)

    def finite_magnitude(self, value: ir.Value | None) -> float | None:
        """An upper bound on ``|x|`` over the finite elements of ``value`` (:meth:`magnitude` where a −inf fill
        counts as nothing): a causal mask ``Trilu(ConstantOfShape(−inf))`` is 0 or −inf, so adding it to
        another mask term never overflows — either the entry was already −inf or nothing was added."""
        return None if value is None else _memoized(self._finite_magnitude, value, None, self._finite_bound)

    def _finite_bound(self, value: ir.Value) -> float | None:
        node = value.producer()
        summary = self.summary(value)
        if summary is not None:
            return summary.finite_bound
        if node is not None and node.op_type == "ConstantOfShape" and node.domain in ("", "ai.onnx"):
            fill = attr(node, "value")
            return summarize(fill.numpy() if fill is not None else np.zeros(1, np.float32)).finite_bound
        if node is None or node.domain not in ("", "ai.onnx") or not node.inputs:
            return None
        op, inputs = node.op_type, node.inputs
        if op in _FINITE_LAYOUT or op in ("Trilu", "Neg", "Abs", "Relu"):
            return self.finite_magnitude(inputs[0])
        if op == "Where" and len(inputs) == 3:
            bounds = [self.finite_magnitude(inputs[1]), self.finite_magnitude(inputs[2])]
            return None if None in bounds else max(bounds)
        return self.magnitude(value)

    def elems(self, value: ir.Value | None) -> tuple[Dim | None, ...] | None:
        if value is None:
            return None
        return self._elems.get(value)

    def shape(self, value: ir.Value | None) -> Shape | None:
        if value is None:
            return None
        if value in self._shape:
            return self._shape[value]
        inferred = shape_of(value)
        lost = inferred is None or any(d is None or d.invented for d in inferred)
        if lost and value in self._const:  # a value this evaluation computed (a buffer sliced by static sizes)
            return tuple(Dim(int(d)) for d in self._const[value].shape)
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
        """Shape vectors with symbolic entries, and shapes of the layout ops shape inference missed."""
        x = node.inputs[0] if node.inputs else None
        if op == "CastLike" and self.const(x) is not None and node.inputs[1].dtype is not None:
            self._set_const(out, self.const(x).astype(node.inputs[1].dtype.numpy()))
            return
        if op == "Shape":
            shape = self.shape(x)
            if shape is not None:
                start = attr(node, "start", 0)
                end = attr(node, "end", None)
                self._set_elems(out, tuple(shape[start:end]))
        elif op == "Abs" and self.elems(x) is not None:  # torchlib's aten_expand: Abs(shape), -1 → 1 (keep)
            self._set_elems(out, tuple(None if d is None else d if d.syms else Dim(abs(d.coef)) for d in self.elems(x)))
        elif op == "Size" and self.elems(x) is not None:  # of a shape vector: the rank (torchlib's IsScalar)
            self._set_const(out, np.array(len(self.elems(x)), np.int64))
            return
        elif op in ("Identity", "Cast", "CastLike", "Squeeze", "Unsqueeze") and self.elems(x) is not None:
            self._set_elems(out, self.elems(x))
        elif op == "Reshape" and self.elems(x) is not None and self.const(node.inputs[1]) is not None:
            if self.const(node.inputs[1]).size == 1:  # a shape vector flattened to 1-D stays itself
                self._set_elems(out, self.elems(x))
        elif op == "Concat" and all(self.elems(v) is not None for v in node.inputs):
            self._set_elems(out, tuple(d for v in node.inputs for d in self.elems(v)))
        elif op == "Gather" and self.elems(x) is not None and self.const(node.inputs[1]) is not None:
            items = self.elems(x)
            idx = self.const(node.inputs[1]).reshape(-1)
            self._set_elems(out, tuple(items[int(i)] for i in idx))
        elif op == "Slice" and self.elems(x) is not None and all(self.const(v) is not None for v in node.inputs[1:]):
            items = np.array(self.elems(x), dtype=object)
            consts = [x, *[self.const(v) for v in node.inputs[1:]]]
            self._set_elems(out, tuple(slice_values(node, items, consts)))
        elif op == "Not" and x in self._flags:
            self._flags[out] = tuple(not f for f in self._flags[x])
        elif op == "Cast" and x in self._flags and attr(node, "to") == ir.DataType.BOOL:
            self._flags[out] = self._flags[x]
        elif op == "Equal" and self.elems(x) is not None and _uniform(self.const(node.inputs[1])) is not None:
            c = _uniform(self.const(node.inputs[1]))
            # A symbolic dim is never negative, so it never equals the -1 that TorchScript's expand tests for.
            flags = [d.static == c if d is not None and d.static is not None else (False if c < 0 else None)
                     for d in self.elems(x)]  # fmt: skip
            if None not in flags:
                self._flags[out] = tuple(flags)
        elif op == "Equal" and self.elems(x) is not None and self.elems(node.inputs[1]) is not None:
            # Two sizes the graph reads from shapes (DeBERTa's ``q_len == k_len``, written as an If): equal
            # where they are the same dim, unequal where both are known numbers, else unknown.
            a, b = self.elems(x), self.elems(node.inputs[1])
            b = b * len(a) if len(b) == 1 else b
            a = a * len(b) if len(a) == 1 else a
            if len(a) == len(b):
                flags = [_same_dim(p, q) for p, q in zip(a, b, strict=True)]
                if None not in flags:
                    self._flags[out] = tuple(flags)
        elif op == "Where" and node.inputs[0] in self._flags:
            a, b = (self.elems(v) for v in node.inputs[1:])
            flags = self._flags[node.inputs[0]]
            if a is not None and b is not None:
                a = a * len(flags) if len(a) == 1 else a
                b = b * len(flags) if len(b) == 1 else b
                if len(a) == len(b) == len(flags):
                    self._set_elems(out, tuple(p if f else q for f, p, q in zip(flags, a, b, strict=True)))
        elif op in ("Add", "Sub") and all(self.elems(v) is not None for v in node.inputs):
            a, b = (self.elems(v) for v in node.inputs)
            b = b * len(a) if len(b) == 1 else b
            summed = tuple(_add(p, q, op == "Sub") for p, q in zip(a, b, strict=True)) if len(a) == len(b) else ()
            if summed and None not in summed:
                self._set_elems(out, summed)
        elif op == "ReduceProd" and self.elems(x) is not None and len(node.inputs) == 1 and attr(node, "keepdims", 1):
            # tf2onnx's Einsum: the batch dims folded into one, (B, N, …) → B·N, as a 1-element shape vector
            self._set_elems(out, (product(self.elems(x)),))
        elif op in ("Max", "Min") and len(node.inputs) == 2 and all(self.elems(v) is not None for v in node.inputs):
            # tf2onnx's Einsum broadcasts the batch dims of its operands: the larger of two equal dims is the dim
            a, b = (self.elems(v) for v in node.inputs)
            if len(a) == len(b):
                self._set_elems(out, tuple(_extreme(p, q, op == "Max") for p, q in zip(a, b, strict=True)))
        elif op in ("Mul", "Div") and all(self.elems(v) is not None for v in node.inputs):
            a, b = (self.elems(v) for v in node.inputs)
            if len(b) == 1:
                b = b * len(a)
            if len(a) == len(b):
                combine = (lambda p, q: p * q) if op == "Mul" else (lambda p, q: p.div(q))
                self._set_elems(
                    out,
                    tuple(None if p is None or q is None else combine(p, q) for p, q in zip(a, b, strict=True)),
                )
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
