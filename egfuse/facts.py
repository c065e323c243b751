"""What is known about each value before lowering: symbolic shapes, dtypes and small constant values.

Exporters compute scales and reshape targets at run time (``Shape → Gather → Cast → Sqrt → Div``,
``Concat(Shape(x)[0], 4, 16)``). Rule conditions need those as facts, so this module evaluates the graph
*abstractly*: small tensors whose inputs are known get their values, shape vectors get partially known
symbolic elements. The graph itself is not changed — the bookkeeping nodes die later if the fused op makes
them unused.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from egfuse.dims import Dim, Shape, reshape_result, shape_of

_MAX_CONST_ELEMENTS = 4096  # larger constants are weights: never needed as facts


def _attr(node: ir.Node, name: str, default=None):
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _broadcast(a: Shape, b: Shape) -> Shape:
    n = max(len(a), len(b))
    a = (Dim(1),) * (n - len(a)) + tuple(a)
    b = (Dim(1),) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b, strict=True):
        if x == Dim(1):
            out.append(y)
        elif y == Dim(1) or x == y:
            out.append(x)
        elif x is None or y is None:
            out.append(None)
        else:  # equal at run time: a symbol shape inference invented is the weaker name for it
            out.append(y if x.invented and not y.invented else x)
    return tuple(out)


def _np_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return (np.trunc(a / b)).astype(a.dtype)
    return (a / b).astype(a.dtype)


def _slice(node: ir.Node, data: np.ndarray, ins: list) -> np.ndarray | None:
    starts, ends = ins[1], ins[2]
    axes = ins[3] if len(ins) > 3 and ins[3] is not None else np.arange(len(starts))
    steps = ins[4] if len(ins) > 4 and ins[4] is not None else np.ones(len(starts), np.int64)
    index = [slice(None)] * data.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps, strict=True):
        index[int(ax)] = slice(int(s), int(e), int(st))
    return data[tuple(index)]


def _result_size(op: str, ins: list) -> float:
    """The element count an evaluation would produce, known before computing it: a causal mask buffer of
    (max_positions)² elements must never be materialised just to learn it is too big to be a fact."""
    try:
        if op == "ConstantOfShape":
            return float(np.prod([float(d) for d in ins[0].reshape(-1)]))
        if op == "Range":
            return max(0.0, np.ceil((float(ins[1]) - float(ins[0])) / float(ins[2])))
        if op in (
            "Add",
            "Sub",
            "Mul",
            "Div",
            "Pow",
            "Equal",
            "Where",
            "Greater",
            "Less",
            "GreaterOrEqual",
            "LessOrEqual",
        ):
            return float(np.prod(np.broadcast_shapes(*(np.shape(x) for x in ins))))
    except (ValueError, ZeroDivisionError, TypeError):
        return float("inf")
    return float(sum(np.size(x) for x in ins if x is not None))


# numpy evaluation of the bookkeeping ops exporters use around attention (all inputs known).
_NUMPY: dict[str, Callable[[ir.Node, list], np.ndarray | None]] = {
    "Identity": lambda n, x: x[0],
    "Cast": lambda n, x: x[0].astype(ir.DataType(_attr(n, "to")).numpy()),
    "CastLike": lambda n, x: x[0].astype(x[1].dtype),
    "IsNaN": lambda n, x: np.isnan(x[0]),
    "IsInf": lambda n, x: (
        (np.isposinf(x[0]) & bool(_attr(n, "detect_positive", 1)))
        | (np.isneginf(x[0]) & bool(_attr(n, "detect_negative", 1)))
    ),
    "Sqrt": lambda n, x: np.sqrt(x[0]),
    "Reciprocal": lambda n, x: (1 / x[0]).astype(x[0].dtype),
    "Neg": lambda n, x: -x[0],
    "Abs": lambda n, x: np.abs(x[0]),
    "Add": lambda n, x: x[0] + x[1],
    "Sub": lambda n, x: x[0] - x[1],
    "Mul": lambda n, x: x[0] * x[1],
    "Div": lambda n, x: _np_div(x[0], x[1]),
    "Pow": lambda n, x: np.power(x[0], x[1]).astype(x[0].dtype),
    "Equal": lambda n, x: np.equal(x[0], x[1]),
    "Greater": lambda n, x: np.greater(x[0], x[1]),
    "Less": lambda n, x: np.less(x[0], x[1]),
    "GreaterOrEqual": lambda n, x: np.greater_equal(x[0], x[1]),
    "LessOrEqual": lambda n, x: np.less_equal(x[0], x[1]),
    "Not": lambda n, x: np.logical_not(x[0]),
    "And": lambda n, x: np.logical_and(x[0], x[1]),
    "Or": lambda n, x: np.logical_or(x[0], x[1]),
    "Sign": lambda n, x: np.sign(x[0]),
    "Log": lambda n, x: np.log(x[0]),
    "Exp": lambda n, x: np.exp(x[0]),
    "Ceil": lambda n, x: np.ceil(x[0]),
    "Floor": lambda n, x: np.floor(x[0]),
    "Max": lambda n, x: functools.reduce(np.maximum, x),
    "Min": lambda n, x: functools.reduce(np.minimum, x),
    "Expand": lambda n, x: x[0] * np.ones([int(d) for d in x[1]], x[0].dtype),
    "Transpose": lambda n, x: np.transpose(x[0], _attr(n, "perm")),
    "Size": lambda n, x: np.array(np.size(x[0]), np.int64),
    "Shape": lambda n, x: np.array(np.shape(x[0])[_attr(n, "start", 0) : _attr(n, "end", None)], np.int64),
    "Where": lambda n, x: np.where(x[0], x[1], x[2]),
    "Concat": lambda n, x: np.concatenate(x, axis=_attr(n, "axis", 0)),
    "Gather": lambda n, x: np.take(x[0], x[1], axis=_attr(n, "axis", 0)),
    "Unsqueeze": lambda n, x: np.reshape(x[0], _unsqueezed(x[0].shape, x[1] if len(x) > 1 else _attr(n, "axes"))),
    "Squeeze": lambda n, x: np.squeeze(
        x[0], axis=tuple(int(a) for a in (x[1] if len(x) > 1 else _attr(n, "axes", ()))) or None
    ),
    "Reshape": lambda n, x: np.reshape(x[0], [int(d) if d != 0 else x[0].shape[i] for i, d in enumerate(x[1])]),
    "Slice": lambda n, x: _slice(n, x[0], x),
    "ConstantOfShape": lambda n, x: np.full(
        tuple(int(d) for d in x[0]),
        _attr(n, "value").numpy().reshape(-1)[0] if _attr(n, "value") is not None else np.float32(0),
    ),
    "Range": lambda n, x: np.arange(x[0], x[1], x[2]).astype(x[0].dtype),
}


# Ops whose (first) output has the shape of their first input, including common contrib ops that ONNX
# shape inference does not know (LayerNormalization below opset 17, SkipLayerNormalization, Gelu …).
SAME_SHAPE = frozenset({
    "Softmax", "Cast", "Sqrt", "IsNaN", "Identity", "Neg", "Relu", "Gelu", "FastGelu", "BiasGelu", "Erf", "Tanh",
    "Sigmoid", "Exp", "Log", "Abs", "Dropout", "Not", "Trilu", "Sign", "Ceil", "Floor",
    "LayerNormalization", "SkipLayerNormalization",
    "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RMSNormalization", "QuickGelu",
})  # fmt: skip


# Elementwise ops with numpy broadcasting: their output shape is their inputs' broadcast (comparisons and
# logic included: causal masks are built from Less/Greater of aranges).
_BROADCASTING = frozenset({
    "Add", "Sub", "Mul", "Div", "Where", "Pow", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal",
    "And", "Or", "Xor", "Max", "Min",
})  # fmt: skip


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


def _axes_and_steps(node: ir.Node, args: list, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A Slice's axes and steps from its constant inputs ``args`` (starts, ends, axes, steps), the defaults where
    absent; ``None`` where one is given but not a constant."""
    if (len(args) > 2 and node.inputs[3] is not None and args[2] is None) or (
        len(args) > 3 and node.inputs[4] is not None and args[3] is None
    ):
        return None
    axes = args[2].reshape(-1) if len(args) > 2 and args[2] is not None else np.arange(count)
    steps = args[3].reshape(-1) if len(args) > 3 and args[3] is not None else np.ones(count, np.int64)
    return axes, steps


def _sharpened(known: Shape | None, computed: Shape) -> Shape:
    """``computed`` where it names a dim that ``known`` (shape inference's) lacks or invented, ``known`` elsewhere."""
    if known is None or len(known) != len(computed):
        return computed
    return tuple(c if (k is None or k.invented) and c is not None else k for k, c in zip(known, computed, strict=True))


def _same_dim(a: Dim | None, b: Dim | None) -> bool | None:
    """Whether two dims are equal: the same dim, or two different numbers; ``None`` where that is not known."""
    if a is None or b is None:
        return None
    if a == b:
        return True
    return False if a.static is not None and b.static is not None else None


def _uniform(array: np.ndarray | None) -> float | None:
    """The one value of a constant whose elements are all equal."""
    if array is None or array.size == 0 or not np.all(array == array.reshape(-1)[0]):
        return None
    return float(array.reshape(-1)[0])


def _unsqueezed(shape: tuple[int, ...], axes) -> tuple[int, ...]:
    axes = np.asarray(axes).reshape(-1)  # torch 2.1's dynamo export passes one axis as a 0-d tensor
    out = list(shape)
    rank = len(shape) + len(axes)
    for a in sorted(int(a) % rank for a in axes):
        out.insert(a, 1)
    return tuple(out)


class GraphFacts:
    """Shapes, dtypes and constant values of a graph's values, by abstract evaluation."""

    def __init__(self, graph: ir.Graph) -> None:
        self.graph = graph
        self._const: dict[ir.Value, np.ndarray] = {}
        self._elems: dict[ir.Value, tuple[Dim | None, ...]] = {}
        self._shape: dict[ir.Value, Shape] = {}
        self._flags: dict[ir.Value, tuple[bool, ...]] = {}  # known boolean vectors (Equal on a shape)
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
            perm = _attr(node, "perm")
            return np.transpose(source, perm)  # a weight stored transposed (Linear's W, dynamo exports)
        return self.const(value)

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
        if tensor is None or tensor.size > _MAX_CONST_ELEMENTS:
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
        if known and op in _NUMPY and ins and _result_size(op, ins) <= _MAX_CONST_ELEMENTS:
            result = _NUMPY[op](node, ins)
            if result is not None and np.size(result) <= _MAX_CONST_ELEMENTS:
                self._set_const(out, np.asarray(result))
                return
        self._visit_symbolic(node, op, out)

    def _visit_split(self, node: ir.Node) -> None:
        """A packed QKV projection split in equal parts (GPT-2's ``c_attn``): each part keeps the input's dims
        but the split axis, where shape inference invents a new name for every output."""
        shape = self.shape(node.inputs[0])
        if shape is None or not shape:
            return
        axis = int(_attr(node, "axis", 0)) % len(shape)
        sizes = self.const(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if sizes is None and _attr(node, "split") is not None:
            sizes = np.asarray(_attr(node, "split"))
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
            self._shape[out] = _sharpened(self.shape(out), result)

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
                start = _attr(node, "start", 0)
                end = _attr(node, "end", None)
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
            self._set_elems(out, tuple(_slice(node, items, consts)))
        elif op == "Not" and x in self._flags:
            self._flags[out] = tuple(not f for f in self._flags[x])
        elif op == "Cast" and x in self._flags and _attr(node, "to") == ir.DataType.BOOL:
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

    def _chunk_shape(self, node: ir.Node) -> Shape | None:
        """``SequenceAt(SplitToSequence(x, n, axis), i)`` where ``n`` divides x's static axis: every chunk has
        x's shape with ``n`` on that axis."""
        split = node.inputs[0].producer() if node.inputs[0] is not None else None
        if split is None or split.op_type != "SplitToSequence" or len(split.inputs) < 2:
            return None
        src, size = self.shape(split.inputs[0]), self.scalar(split.inputs[1])
        if src is None or size is None or not _attr(split, "keepdims", 1):
            return None
        axis = _attr(split, "axis", 0) % len(src)
        whole = src[axis]
        if whole is None or whole.static is None or size <= 0 or whole.static % int(size):
            return None
        return (*src[:axis], Dim(int(size)), *src[axis + 1 :])

    def _sliced_shape(self, node: ir.Node, shape: Shape) -> Shape | None:
        """A Slice's output shape where its starts/ends/axes/steps are constants: a static dim sliced exactly, a
        symbolic one only when the slice keeps all of it (start 0, end past any size, step 1: torch's ``x[:, :]``)."""
        args = [self.const(v) if v is not None else None for v in node.inputs[1:5]]
        if len(args) >= 2 and args[0] is not None and args[1] is None and self.elems(node.inputs[2]) is not None:
            return self._cut_to_length(node, shape, args)
        if len(args) < 2 or args[0] is None or args[1] is None:
            return None
        starts, ends = args[0].reshape(-1), args[1].reshape(-1)
        given = _axes_and_steps(node, args, len(starts))
        if given is None:
            return None
        axes, steps = given
        out = list(shape)
        for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
            axis = int(axis) % len(shape)
            d = shape[axis]
            if d is not None and d.static is not None:
                out[axis] = Dim(len(range(d.static)[slice(int(start), int(end), int(step))]))
            elif not (int(start) == 0 and int(end) >= 2**31 - 1 and int(step) == 1):
                out[axis] = None
        return tuple(out)

    def _cut_to_length(self, node: ir.Node, shape: Shape, args: list) -> Shape | None:
        """``buffer[..., :n]`` with ``n`` a symbolic size read off another tensor (``Shape(x)[1]``, the sequence
        length): the causal-mask buffers of GPT-2-style attention and the RoPE cos/sin tables cut to the
        sequence. The result has ``min(n, D) - start`` elements on a static axis of size ``D``; it is taken as
        ``n - start`` only where ``D`` is a buffer's fixed size (a constant: the model's maximum length), and
        ``start`` is 0 for a symbolic ``n``. Where ``n > D`` the original fails wherever the cut is combined with
        an axis of length ``n`` (the broadcast against the scores, the rotation's product with Q), which is
        all its consumers in attention do — and validation on onnxruntime runs every fused region anyway."""
        if not self._stored(node.inputs[0]):
            return None  # only a stored buffer has the fixed "maximum length" the cut stays within
        starts, ends = args[0].reshape(-1), self.elems(node.inputs[2])
        given = _axes_and_steps(node, args, len(starts))
        if given is None or not len(starts) == len(ends) == len(given[0]) == len(given[1]):
            return None
        axes, steps = given
        out = list(shape)
        for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
            axis = int(axis) % len(shape)
            d = shape[axis]
            if end is None or d is None or int(step) != 1 or d.static is None:
                return None
            if end.static is not None:  # a constant end among symbolic ones: exact
                out[axis] = Dim(len(range(d.static)[slice(int(start), end.static)]))
            elif int(start) == 0:
                out[axis] = end
            else:
                return None
        return tuple(out)

    def _stored(self, value: ir.Value | None, depth: int = 8) -> bool:
        """``value`` is a stored constant, or cut, cast or moved from one (torch slices a buffer axis by axis)."""
        if value is None or depth < 0:
            return False
        if self.weight(value) is not None:
            return True
        node = value.producer()
        moves = ("Slice", "Cast", "Identity", "Unsqueeze", "Squeeze", "Transpose")
        return node is not None and node.op_type in moves and self._stored(node.inputs[0], depth - 1)

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
        ``Shape``); a dim computed here from the inputs wins over such a symbol."""
        known = self.shape(out)
        if known is not None and all(d is not None and not d.invented for d in known):
            return
        ins = [self.shape(v) for v in node.inputs]
        result: Shape | None = None
        if op == "Reshape" and ins and self.reshape_spec(node) is not None:
            result = reshape_result(ins[0], self.reshape_spec(node), bool(_attr(node, "allowzero", 0)))
        elif op == "Transpose" and ins and ins[0] is not None:
            perm = _attr(node, "perm") or list(reversed(range(len(ins[0]))))
            result = tuple(ins[0][p] for p in perm)
        elif op == "MatMul" and len(ins) == 2 and ins[0] is not None and ins[1] is not None:
            a, b = ins
            if len(a) >= 2 and len(b) >= 2:
                result = (*_broadcast(a[:-2], b[:-2]), a[-2], b[-1])
        elif op in _BROADCASTING and all(s is not None for s in ins):
            result = ins[0]
            for s in ins[1:]:
                result = _broadcast(result, s)
        elif op in SAME_SHAPE and ins and ins[0] is not None:
            result = ins[0]
        elif op == "Gemm" and len(ins) >= 2 and ins[0] is not None and ins[1] is not None:  # torch 2.1's addmm
            a, b = ins[0], ins[1]
            if len(a) == 2 and len(b) == 2:
                result = (a[1] if _attr(node, "transA", 0) else a[0], b[0] if _attr(node, "transB", 0) else b[1])
        elif op == "Slice" and ins and ins[0] is not None:
            result = self._sliced_shape(node, ins[0])
        elif op == "SequenceAt":  # torch 2.1's tensor.split(n, dim): SplitToSequence into equal chunks
            result = self._chunk_shape(node)
        elif op == "Range" and len(node.inputs) == 3 and all(self.elems(v) is not None for v in node.inputs):
            start, limit, delta = (self.elems(v)[0] if len(self.elems(v)) == 1 else None for v in node.inputs)
            if start is not None and limit is not None and delta == Dim(1):
                count = limit.plus(start, -1)  # arange(start, n): n - start elements (n ≥ start)
                result = None if count.summed else (count,)
        elif op == "GatherND" and len(ins) == 2 and ins[0] is not None and ins[1] is not None and ins[1]:
            depth, batch = ins[1][-1], int(_attr(node, "batch_dims", 0))  # torch 2.1's x[index] (RoPE's cos[ids])
            if depth is not None and depth.static is not None:
                result = (*ins[1][:-1], *ins[0][batch + depth.static :])
        elif op == "Concat" and ins and all(s is not None and len(s) == len(ins[0]) for s in ins):
            axis = int(_attr(node, "axis", 0)) % len(ins[0]) if ins[0] else 0
            # The axis adds up only where that names no new size: all parts static, or one part. A cache's
            # past + new keys stay the exporter's (or shape inference's) name for the total length.
            sizes = [s[axis] for s in ins]
            total: Dim | None = sizes[0] if len(sizes) == 1 else None
            if len(sizes) > 1 and all(d is not None and d.static is not None for d in sizes):
                total = Dim(sum(d.static for d in sizes))
            result = tuple(total if i == axis else d for i, d in enumerate(ins[0])) if ins[0] else None
        elif op == "GatherElements" and len(ins) == 2:
            result = ins[1]  # the output has the indices' shape
        elif op == "Tile" and ins and ins[0] is not None and self.elems(node.inputs[1]) is not None:
            repeats = self.elems(node.inputs[1])
            if len(repeats) == len(ins[0]):
                result = tuple(None if d is None or r is None else d * r for d, r in zip(ins[0], repeats, strict=True))
        elif op == "Squeeze" and ins and ins[0] is not None:  # torchlib's squeeze, its If folded
            axes = self.const(node.inputs[1]) if len(node.inputs) > 1 else _attr(node, "axes")
            if axes is not None:
                drop = {int(a) % len(ins[0]) for a in np.asarray(axes).reshape(-1)}
                if all(ins[0][a] == Dim(1) for a in drop):
                    result = tuple(d for i, d in enumerate(ins[0]) if i not in drop)
        elif op == "Unsqueeze" and ins and ins[0] is not None:
            axes = self.const(node.inputs[1]) if len(node.inputs) > 1 else _attr(node, "axes")
            if axes is not None:
                rank = len(ins[0]) + len(np.asarray(axes).reshape(-1))
                out_dims = list(ins[0])
                for a in sorted(int(a) % rank for a in np.asarray(axes).reshape(-1)):
                    out_dims.insert(a, Dim(1))
                result = tuple(out_dims)
        elif op == "Expand" and ins and ins[0] is not None and self.elems(node.inputs[1]) is not None:
            target = tuple(d if d is not None and d != Dim(1) else (d if d is None else Dim(1))
                           for d in self.elems(node.inputs[1]))  # fmt: skip
            result = _broadcast(ins[0], target)
        elif op == "Gather" and len(ins) == 2 and ins[0] is not None and ins[1] is not None:
            axis = int(_attr(node, "axis", 0)) % len(ins[0])  # an embedding lookup keeps the ids' (B, S)
            result = (*ins[0][:axis], *ins[1], *ins[0][axis + 1 :])
        elif op == "Einsum" and all(s is not None for s in ins):
            result = _einsum_shape(str(_attr(node, "equation", "")), ins)
        elif op == "Conv" and len(ins) >= 2 and ins[0] is not None and ins[1] is not None:
            unit = all(d == Dim(1) for d in ins[1][2:]) and not any(_attr(node, a) for a in ("pads", "auto_pad"))
            if unit and all(int(s) == 1 for s in _attr(node, "strides") or [1]) and len(ins[0]) == len(ins[1]):
                result = (ins[0][0], ins[1][0], *ins[0][2:])  # a 1×1 convolution keeps the spatial dims
        if result is None:
            return
        self._shape[out] = _sharpened(known, result)


def _einsum_shape(equation: str, shapes: list) -> Shape | None:
    """An explicit Einsum's output dims, each read from an operand that carries its letter (no ``...``)."""
    equation = equation.replace(" ", "")
    if "->" not in equation or "..." in equation:
        return None
    lhs, out = equation.split("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        return None
    dims: dict[str, Dim | None] = {}
    for term, shape in zip(terms, shapes, strict=True):
        if len(term) != len(shape):
            return None
        for letter, d in zip(term, shape, strict=True):
            if dims.get(letter) is None or dims[letter] == Dim(1):
                dims[letter] = d
    return tuple(dims.get(letter) for letter in out)
