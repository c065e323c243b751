"""Models past protobuf's 2 GB limit: a ``ModelProto`` that large can be held in memory but not serialized,
so ONNX's shape inference, its version converter and ``InferenceSession(bytes)`` cannot take it. Each of
those runs on a *skeleton* (the same graph with the large weights' data left out; shapes and names kept)
or on a file with the weights stored beside it, and the weights are put back by name."""

from __future__ import annotations

import math
from pathlib import Path

import onnx
import onnx_ir as ir

LARGE_BYTES = 1_500_000_000
"""Weights above this (protobuf's hard limit is 2 GiB for the whole message) take the paths below."""

_SMALL_TENSOR = 1 << 16  # a skeleton keeps the data of tensors below this: shape constants, scales, masks


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """The size of a tensor's data, from its dims (reading ``raw_data`` would copy it)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return 0
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError):
        itemsize = 8
    return math.prod(tensor.dims) * itemsize


def is_large(model: onnx.ModelProto) -> bool:
    return sum(tensor_bytes(t) for t in model.graph.initializer) > LARGE_BYTES


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without the data of its large initializers (dims, type and name kept): what shape
    inference and the version converter need, small enough to serialize."""
    bare = onnx.ModelProto(
        ir_version=model.ir_version,
        producer_name=model.producer_name,
        producer_version=model.producer_version,
        domain=model.domain,
        model_version=model.model_version,
        doc_string=model.doc_string,
    )
    bare.opset_import.extend(model.opset_import)
    bare.metadata_props.extend(model.metadata_props)
    bare.functions.extend(model.functions)
    graph = model.graph
    bare.graph.name = graph.name
    bare.graph.doc_string = graph.doc_string
    for field in ("node", "input", "output", "value_info", "sparse_initializer", "metadata_props"):
        getattr(bare.graph, field).extend(getattr(graph, field))
    for tensor in graph.initializer:
        if tensor_bytes(tensor) < _SMALL_TENSOR:
            bare.graph.initializer.append(tensor)
        else:
            bare.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
    return bare


def restore_weights(bare: onnx.ModelProto, model: onnx.ModelProto) -> onnx.ModelProto:
    """Put ``model``'s large initializers back into ``bare`` (a skeleton, possibly converted), by name."""
    weights = {t.name: t for t in model.graph.initializer if tensor_bytes(t) >= _SMALL_TENSOR}
    for tensor in bare.graph.initializer:
        if tensor.name in weights and not tensor.raw_data:
            tensor.CopyFrom(weights[tensor.name])
    return bare


def save_with_external_data(model: onnx.ModelProto, path: Path) -> Path:
    """Write ``model`` to ``path`` with its weights in ``<name>.data`` beside it, without the in-memory copy
    ``onnx.save_model`` makes (onnx-ir streams each tensor to the file)."""
    ir.save(ir.serde.deserialize_model(model), path, external_data=f"{path.name}.data")
    return path


def convert_version(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
    """onnx's version converter, on a skeleton where the model is too large to serialize."""
    if not is_large(model):
        return onnx.version_converter.convert_version(model, version)
    return restore_weights(onnx.version_converter.convert_version(skeleton(model), version), model)
