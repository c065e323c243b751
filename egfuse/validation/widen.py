"""Wider references: the same graph computed in float32 (for half-precision models) or float64 (for float32
ones), to judge a fused op against the exact answer where the original's own rounding decides the outcome.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import onnx

from egfuse.files import protos
from egfuse.validation import memory
from egfuse.validation.runner import run

__all__ = ["HALF_TYPES", "largest_fill", "references", "upcast", "upcast_feeds"]

HALF_TYPES = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})


FILL_ULPS = 4
"""How far inside the ends of a half type's range a value still counts as a fill (egfuse moves finfo.min one
ulp up where a kernel would read it as −inf)."""


def _keep_fills(narrow: np.ndarray, wide: np.ndarray) -> np.ndarray:
    """``wide`` with the fills of ``narrow`` — values at the ends of its type's range, up to ``FILL_ULPS`` ulps
    inside, and at half of them (what egfuse writes a half-precision fused op's fill as) — moved to the same
    place in the wide type's range: finfo(float16).min absorbs every score it is
    added to in float16, and must still once widened (−65504 in float32 would not, and a clamp at it would
    then change what the graph computes)."""
    if narrow.dtype != np.float16:  # bfloat16 has float32's range: its ends absorb float32 scores as they are
        return wide
    top, wide_top = np.finfo(narrow.dtype).max, np.finfo(wide.dtype).max
    ulp = float(top) - float(np.nextafter(top, narrow.dtype.type(0)))
    wide_ulp = float(wide_top) - float(np.nextafter(wide_top, wide.dtype.type(0)))
    values = narrow.astype(np.float64)
    out = wide
    for sign in (-1.0, 1.0):
        with np.errstate(invalid="ignore"):
            steps = (float(top) - sign * values) / ulp
        fill = np.isfinite(steps) & (steps >= 0) & (steps <= FILL_ULPS) & (np.round(steps) == steps)
        if fill.any():
            out = np.where(fill, sign * (float(wide_top) - steps * wide_ulp), out).astype(wide.dtype)
        # half the range: the fill egfuse writes for a half-precision fused op (raise_masks.moved_lowest), one
        # ulp inside the wide type's end (where onnxruntime's standard op would read the end itself as −inf)
        halved = values == sign * float(narrow.dtype.type(float(top) / 2))
        if halved.any():
            out = np.where(halved, sign * (float(wide_top) - wide_ulp), out).astype(wide.dtype)
    return out


def upcast(model: onnx.ModelProto, *, to: int = onnx.TensorProto.FLOAT, fills: bool = False) -> onnx.ModelProto:
    """The same graph computed wider: every float16/bfloat16 tensor, type and cast target widened to float32
    (``to=DOUBLE``: float32 ones too, to float64).

    The reference that outputs are judged against where the primitive ops' own rounding decides the answer
    (half precision; a query row whose keys a finite fill hides): a fused op rounds differently from the
    primitive ops, so the question is not "are they equal" but "is the fused model no further from the
    exact result than the original is".

    ``fills``: the fills at the ends of a half type's range stay at the ends of float32's
    (:func:`_keep_fills`) — for comparing two models' meaning on float32 copies, and for the second of a
    half-precision model's two references (:func:`egfuse.validation.validate.compare`'s ``absorbed``)."""
    narrow = HALF_TYPES | ({onnx.TensorProto.FLOAT} if to == onnx.TensorProto.DOUBLE else set())
    wide_type = onnx.helper.tensor_dtype_to_np_dtype(to)
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    graph = wide.graph
    for info in [*graph.input, *graph.output, *graph.value_info]:
        _widen_type(info.type, narrow, to)

    cast_down = _cast_to_half(model) if fills else {}

    def widen(tensor: onnx.TensorProto, name: str) -> None:
        if tensor.data_type in narrow:
            array = onnx.numpy_helper.to_array(tensor)
            widened = array.astype(wide_type)
            if fills and tensor.data_type in HALF_TYPES:
                widened = _keep_fills(array, widened)
            tensor.CopyFrom(onnx.numpy_helper.from_array(widened, tensor.name))
        elif name in cast_down and tensor.data_type == onnx.TensorProto.FLOAT and _small(tensor):
            array = onnx.numpy_helper.to_array(tensor)
            kept = _keep_fills(array.astype(cast_down[name]), array)
            if not np.array_equal(kept, array):
                tensor.CopyFrom(onnx.numpy_helper.from_array(kept, tensor.name))

    for tensor in graph.initializer:
        widen(tensor, tensor.name)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                widen(attr.t, node.output[0] if node.op_type in _CONSTANTS and node.output else "")
            elif attr.name in ("to", "dtype") and attr.type == onnx.AttributeProto.INT and attr.i in narrow:
                attr.i = to
    return wide


def _cast_to_half(model: onnx.ModelProto) -> dict[str, np.dtype]:
    """The values cast to a half type (``Cast`` to it, ``CastLike`` to a value of it or of no known type) → that
    type. An exporter may write a half-precision mask's fill as a float32 constant cast down (torch's
    ``finfo(float16).min`` as float32 −65504, then ``CastLike`` the mask): in the model it is the half type's
    end all the same, and a copy that keeps fills must keep that one too."""
    types = _elem_types(model)
    for node in model.graph.node:
        value = node.attribute[0] if node.op_type in _CONSTANTS and node.output and node.attribute else None
        if value is not None and value.type == onnx.AttributeProto.TENSOR:
            types[node.output[0]] = value.t.data_type
    found: dict[str, np.dtype] = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or not node.input:
            continue
        if node.op_type == "Cast":
            target = next((a.i for a in node.attribute if a.name == "to"), None)
        elif node.op_type == "CastLike" and len(node.input) > 1:
            target = types.get(node.input[1], onnx.TensorProto.FLOAT16)
        else:
            continue
        if target == onnx.TensorProto.FLOAT16:  # (bfloat16 has float32's range: no fill of its own to keep)
            found[node.input[0]] = np.dtype(np.float16)
    return found


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """The element type of each graph input, typed value and initializer, by name."""
    types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.value_info]}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    return types


_CONSTANTS = ("Constant", "ConstantOfShape")
"""Nodes whose tensor attribute is their output's value (a fill read by name as a cast's input)."""


def _small(tensor: onnx.TensorProto) -> bool:
    external = tensor.data_location == onnx.TensorProto.EXTERNAL
    return not external and int(np.prod(tensor.dims, dtype=np.int64)) <= FILL_SCAN_LIMIT


def _widen_type(proto: onnx.TypeProto, narrow: set[int] | frozenset[int], to: int) -> None:
    """A value's type widened, inside a sequence or an optional too (a ``SplitToSequence`` of float16 tensors)."""
    kind = proto.WhichOneof("value")
    if kind == "tensor_type" and proto.tensor_type.elem_type in narrow:
        proto.tensor_type.elem_type = to
    elif kind == "sequence_type":
        _widen_type(proto.sequence_type.elem_type, narrow, to)
    elif kind == "optional_type":
        _widen_type(proto.optional_type.elem_type, narrow, to)


FILL_SCAN_LIMIT = 4096
"""Constants larger than this are weights, not fills: :func:`largest_fill` does not read them."""


def largest_fill(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> float:
    """The largest finite magnitude among the float feeds and the graph's small float constants (initializers,
    ``Constant`` and ``ConstantOfShape`` values): a mask's finite fill (−1e4, −1e6, finfo.min) where there is
    one. A score added to it is rounded to the fill's ulp, which is how far apart two correct programs may be
    in a query row whose every key it hides (:func:`egfuse.validation.validate.compare`)."""
    largest = 0.0

    def see(array: np.ndarray) -> None:
        nonlocal largest
        if array.size and np.issubdtype(array.dtype, np.floating):
            finite = np.abs(array[np.isfinite(array)].astype(np.float64))
            largest = max(largest, float(finite.max()) if finite.size else 0.0)

    for value in feeds.values():
        see(np.asarray(value))
    tensors = [*model.graph.initializer]
    tensors += [a.t for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    for tensor in tensors:
        if int(np.prod(tensor.dims, dtype=np.int64)) <= FILL_SCAN_LIMIT and not tensor.external_data:
            try:
                see(onnx.numpy_helper.to_array(tensor))
            except (ValueError, TypeError):  # a type numpy cannot hold: no fill there
                continue
    return largest


def upcast_feeds(feeds: dict[str, np.ndarray], to: type = np.float32, fills: bool = False) -> dict[str, np.ndarray]:
    """The feeds for :func:`upcast`'s copy: half-precision arrays widened (``to=np.float64``: float32 too);
    ``fills`` as there."""
    halves = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
    narrow = (*halves, np.dtype(np.float32)) if to == np.float64 else halves

    def widen(value: np.ndarray) -> np.ndarray:
        wide = value.astype(to)
        return _keep_fills(value, wide) if fills and value.dtype in halves else wide

    return {k: widen(v) if v.dtype in narrow else v for k, v in feeds.items()}


def references(
    original: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    expected: dict[str, np.ndarray],
    names: list[str],
    *,
    weights: protos.DetachedWeights | None = None,
    budget: int | None = None,
    float32_too: bool = False,
    fills: bool = False,
) -> dict[str, np.ndarray]:
    """Float32 references for the half-precision outputs among ``expected`` (``float32_too``: float64 ones for
    the float32 outputs as well; ``fills``: a half type's fills kept at the ends of float32's range, so that they
    absorb every score they are added to, as they do in half precision — :func:`upcast`). Empty when there are
    none, when the widened model does not run or would go over the memory ``budget``, or for a model past
    protobuf's limit, whose weights a widened copy would double: then the fixed tolerances apply. A smaller
    model whose weights were kept apart (``weights``) is widened from a copy with them inline."""
    if weights is not None and weights.large:
        return {}
    narrowest = 32 if float32_too else 16
    if not any(np.issubdtype(v.dtype, np.floating) and np.finfo(v.dtype).bits <= narrowest for v in expected.values()):
        return {}
    if weights is not None:
        whole = onnx.ModelProto()
        whole.CopyFrom(original)
        original = weights.restore(whole)
    to, feed_type = (onnx.TensorProto.DOUBLE, np.float64) if float32_too else (onnx.TensorProto.FLOAT, np.float32)
    try:
        widened, data = upcast(original, to=to, fills=fills), upcast_feeds(feeds, feed_type, fills=fills)
        for i, node in enumerate(widened.graph.node):  # onnxruntime names the node it has no kernel for
            node.name = node.name or f"_egfuse_node_{i}"
        memory.check(widened, data, budget, weights_mapped=False)
        for _ in range(NARROWED_NODES):
            try:
                return run(widened, data, names)
            except Exception as err:  # an op without float64 (AveragePool, Erf, QuantizeLinear): run it in float32
                missing = _NO_KERNEL.search(str(err))
                if not float32_too or missing is None:
                    raise
                widened = _in_float32(widened, missing.group(1) or missing.group(2))
    except Exception:  # the widened model does not run: fall back to the fixed tolerance
        pass
    return {}


NARROWED_NODES = 8
"""Nodes a float64 reference may compute in float32 (ops onnxruntime has no double kernel for): the rest of
the graph stays wide."""

_NO_KERNEL = re.compile(
    r"Could not find an implementation for \S+ node with name '([^']*)'"
    r"|of operator \(\w+\) in node \(([^)]*)\) is invalid"  # a schema without double: QuantizeLinear
)


def _in_float32(model: onnx.ModelProto, node_name: str) -> onnx.ModelProto:
    """``model`` with the named node computed in float32: its float64 inputs cast down, its outputs back up."""
    types = _elem_types(onnx.shape_inference.infer_shapes(model))
    double = onnx.TensorProto.DOUBLE
    nodes = list(model.graph.node)
    index = next(i for i, n in enumerate(nodes) if n.name == node_name)
    node = onnx.NodeProto()
    node.CopyFrom(nodes[index])
    before, after = [], []
    for i, name in enumerate(node.input):
        if name and types.get(name) == double:
            node.input[i] = f"{name}__f32_{index}"
            before.append(onnx.helper.make_node("Cast", [name], [node.input[i]], to=onnx.TensorProto.FLOAT))
    for i, name in enumerate(node.output):  # float outputs back up (inference may have typed them float)
        if name and types.get(name, double) in (double, onnx.TensorProto.FLOAT):
            node.output[i] = f"{name}__f32_{index}"
            after.append(onnx.helper.make_node("Cast", [node.output[i]], [name], to=double))
    narrowed = onnx.ModelProto()
    narrowed.CopyFrom(model)
    del narrowed.graph.node[:]
    narrowed.graph.node.extend([*nodes[:index], *before, node, *after, *nodes[index + 1 :]])
    return narrowed
