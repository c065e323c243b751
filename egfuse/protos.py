"""Models past protobuf's 2 GB limit: a ``ModelProto`` that large can be held in memory but not serialized,
so ONNX's shape inference, its version converter and ``InferenceSession(bytes)`` cannot take it, and every
copy of it costs its full size in memory (an LLM's weights are most of a machine's RAM).

Such a model is split once into a *skeleton* (the whole graph, its small tensors inline) and one file
holding its large tensors, which the skeleton's initializers reference as external data. Every stage runs on
the skeleton; onnxruntime maps that one file for every validation session instead of holding a copy per
session; the data is put back only into the model handed back to the caller."""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import LiftConstantsToInitializersPass

LARGE_BYTES = 1_500_000_000
"""Weights above this (protobuf's hard limit is 2 GiB for the whole message) take the paths below."""

_SMALL_TENSOR = 1 << 16
"""A skeleton keeps the data of tensors below this inline: shape constants, scales, masks, RoPE tables — what
the stages read to reason about the graph."""

_ALIGNMENT = 1 << 16
"""Offsets in the weights file: onnxruntime maps external data only at its allocation granularity (4 KiB on
Linux, 64 KiB on Windows); elsewhere it reads a private copy."""


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """The size of a tensor's data, from its dims (reading ``raw_data`` would copy it)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return 0
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError):
        itemsize = 8
    return math.prod(tensor.dims) * itemsize


def _constant_value(node: onnx.NodeProto) -> onnx.TensorProto | None:
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
        return None
    return next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)


def _tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """The main graph's initializers and ``Constant`` values: exporters put weights in either."""
    yield from model.graph.initializer
    for node in model.graph.node:
        value = _constant_value(node)
        if value is not None:
            yield value


def is_large(model: onnx.ModelProto) -> bool:
    return sum(tensor_bytes(t) for t in _tensors(model)) > LARGE_BYTES


def _detachable(tensor: onnx.TensorProto) -> bool:
    return tensor.data_type != onnx.TensorProto.STRING and tensor_bytes(tensor) >= _SMALL_TENSOR


class DetachedWeights:
    """A large model's skeleton and the file its large tensors were written to; a context manager that
    deletes the file.

    Large ``Constant`` values become initializers of the same name in the skeleton (a file reference needs
    an initializer; the computation is the same), so the model handed back has them as initializers."""

    FILE = "weights.bin"

    def __init__(self, model: onnx.ModelProto) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="egfuse-weights-"))
        self.lifted = 0
        self._sources: dict[str, onnx.TensorProto] = {}  # name → the caller's tensor, to copy back from
        self._sessions = 0
        try:
            self.skeleton = self._split(model)
        except BaseException:
            self.close()
            raise

    def _split(self, model: onnx.ModelProto) -> onnx.ModelProto:
        bare = onnx.ModelProto()
        _copy_fields(model, bare, skip={"graph"})
        graph, out = model.graph, bare.graph
        _copy_fields(graph, out, skip={"node", "initializer"})
        with open(self.directory / self.FILE, "wb") as data:
            for tensor in graph.initializer:
                if _detachable(tensor):
                    self._write(tensor, tensor.name, data, out.initializer.add())
                else:
                    out.initializer.append(tensor)
            outputs = {o.name for o in graph.output}
            for node in graph.node:
                value = _constant_value(node)
                if value is not None and _detachable(value) and node.output[0] not in outputs:
                    self._write(value, node.output[0], data, out.initializer.add())
                    self.lifted += 1
                else:
                    out.node.append(node)
        return bare

    def _write(self, tensor: onnx.TensorProto, name: str, data: BinaryIO, ref: onnx.TensorProto) -> None:
        """Append ``tensor``'s bytes to the weights file and make ``ref`` point at them."""
        offset = math.ceil(data.tell() / _ALIGNMENT) * _ALIGNMENT
        data.seek(offset)
        payload = tensor.raw_data if tensor.HasField("raw_data") else onnx.numpy_helper.to_array(tensor).tobytes()
        data.write(payload)
        self._sources[name] = tensor
        ref.name, ref.data_type = name, tensor.data_type
        ref.dims.extend(tensor.dims)
        ref.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.FILE), ("offset", str(offset)), ("length", str(len(payload)))):
            ref.external_data.add(key=key, value=value)

    def to_ir(self, proto: onnx.ModelProto) -> ir.Model:
        """The IR of a model made from the skeleton, its large tensors readable (mapped from the file)."""
        model = ir.serde.deserialize_model(proto)
        ir.external_data.set_base_dir(model.graph, self.directory)
        return model

    def model_file(self, proto: onnx.ModelProto) -> Path:
        """``proto`` written beside the weights file, for onnxruntime to load it from there."""
        self._sessions += 1
        path = self.directory / f"model{self._sessions}.onnx"
        path.write_bytes(proto.SerializeToString())
        return path

    def restore(self, proto: onnx.ModelProto) -> onnx.ModelProto:
        """``proto`` (made from the skeleton) with the weights it references copied back inline from the
        caller's model (a copy in C++, without the transient Python ``bytes`` reading the file would make)."""
        for tensor in proto.graph.initializer:
            source = self._sources.get(tensor.name)
            if source is not None and tensor.data_location == onnx.TensorProto.EXTERNAL:
                name = tensor.name
                tensor.CopyFrom(source)
                tensor.name = name  # a Constant's value may carry another name, or none
        return proto

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> DetachedWeights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copy_fields(source, target, skip: set[str]) -> None:
    """Copy every field ``source`` sets into ``target``, except those in ``skip`` (CopyFrom takes them all)."""
    for field, value in source.ListFields():
        if field.name in skip:
            continue
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
        if repeated:  # (protobuf 6 replaced ``label`` with ``is_repeated``)
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def save_with_external_data(model: onnx.ModelProto, path: Path) -> Path:
    """Write ``model`` to ``path`` with its weights in ``<name>.data`` beside it, without the in-memory copy
    ``onnx.save_model`` makes (onnx-ir streams each tensor to the file). Large ``Constant`` values become
    initializers first: only those can live outside the file, and left inline they can push it past 2 GB."""
    model_ir = ir.serde.deserialize_model(model)
    LiftConstantsToInitializersPass(size_limit=_SMALL_TENSOR // 4)(model_ir)
    ir.save(model_ir, path, external_data=f"{path.name}.data")
    return path
