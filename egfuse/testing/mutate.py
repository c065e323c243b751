"""Broken models, on purpose: the mutations the robustness suite and ``experiments/robustness.py`` feed egfuse
— at the byte level (a flipped byte, a cut, garbage spliced in: what a bad download or a full disk leaves) and at
the graph level (a renamed input, a dropped or duplicated node, dims, attributes and data changed: what a
buggy exporter or a hand edit leaves). Each takes a ``random.Random`` so a seed reproduces it."""

from __future__ import annotations

import random
from collections.abc import Callable

import onnx


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One to three byte-level faults."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(("flip", "cut", "splice", "zero"))
        if not out:
            break
        at = rng.randrange(len(out))
        if kind == "flip":
            out[at] ^= 1 << rng.randrange(8)
        elif kind == "cut":
            del out[at:]
        elif kind == "splice":
            out[at:at] = rng.randbytes(rng.randint(1, 16))
        else:
            span = rng.randint(1, 64)
            out[at : at + span] = bytes(min(span, len(out) - at))
    return bytes(out)


def _rename_input(model: onnx.ModelProto, rng: random.Random) -> None:
    node = rng.choice([n for n in model.graph.node if n.input])
    node.input[rng.randrange(len(node.input))] = rng.choice(("ghost", node.output[0], model.graph.input[0].name))


def _drop_node(model: onnx.ModelProto, rng: random.Random) -> None:
    del model.graph.node[rng.randrange(len(model.graph.node))]


def _duplicate_node(model: onnx.ModelProto, rng: random.Random) -> None:
    node = model.graph.node[rng.randrange(len(model.graph.node))]
    model.graph.node.append(node)


def _swap_nodes(model: onnx.ModelProto, rng: random.Random) -> None:
    nodes = list(model.graph.node)
    i, j = rng.randrange(len(nodes)), rng.randrange(len(nodes))
    nodes[i], nodes[j] = nodes[j], nodes[i]
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _change_dims(model: onnx.ModelProto, rng: random.Random) -> None:
    tensors = list(model.graph.initializer)
    if tensors:
        tensor = rng.choice(tensors)
        if tensor.dims:
            tensor.dims[rng.randrange(len(tensor.dims))] = rng.choice((0, 1, 3, -1, 1 << 40))
        return
    _change_attribute(model, rng)


def _cut_data(model: onnx.ModelProto, rng: random.Random) -> None:
    tensors = [t for t in model.graph.initializer if t.raw_data]
    tensors += [
        a.t for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR and a.t.raw_data
    ]
    if tensors:
        tensor = rng.choice(tensors)
        tensor.raw_data = tensor.raw_data[: rng.randrange(len(tensor.raw_data))]


def _change_attribute(model: onnx.ModelProto, rng: random.Random) -> None:
    attributes = [(n, a) for n in model.graph.node for a in n.attribute]
    if not attributes:
        return
    node, attr = rng.choice(attributes)
    if attr.type == onnx.AttributeProto.INT:
        attr.i = rng.choice((-5, -1, 0, 7, 1 << 40))
    elif attr.type == onnx.AttributeProto.INTS:
        attr.ints[:] = [rng.choice((-5, 0, 9)) for _ in range(rng.randint(0, 5))]
    elif attr.type == onnx.AttributeProto.FLOAT:
        attr.f = rng.choice((0.0, -1.0, float("nan"), float("inf")))
    else:
        node.attribute.remove(attr)


def _change_op(model: onnx.ModelProto, rng: random.Random) -> None:
    node = model.graph.node[rng.randrange(len(model.graph.node))]
    node.op_type = rng.choice(("Softmax", "MatMul", "Transpose", "Reshape", "NoSuchOp", "Add"))


def _change_type(model: onnx.ModelProto, rng: random.Random) -> None:
    info = rng.choice([*model.graph.input, *model.graph.output])
    info.type.tensor_type.elem_type = rng.choice(
        (onnx.TensorProto.INT64, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.STRING)
    )


def _change_opset(model: onnx.ModelProto, rng: random.Random) -> None:
    model.opset_import[0].version = rng.choice((0, 1, 6, 13, 99))


GRAPH_MUTATIONS: dict[str, Callable[[onnx.ModelProto, random.Random], None]] = {
    "input renamed": _rename_input,
    "node dropped": _drop_node,
    "node duplicated": _duplicate_node,
    "nodes swapped": _swap_nodes,
    "dims changed": _change_dims,
    "data cut": _cut_data,
    "attribute changed": _change_attribute,
    "op changed": _change_op,
    "input/output type changed": _change_type,
    "opset changed": _change_opset,
}
"""Graph-level faults by name."""


def mutate_graph(model: onnx.ModelProto, kind: str, rng: random.Random) -> onnx.ModelProto:
    """A copy of ``model`` with one fault of ``kind`` (``model`` itself is not touched)."""
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    GRAPH_MUTATIONS[kind](broken, rng)
    return broken
