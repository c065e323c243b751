"""Models past protobuf's 2 GB limit: a ``ModelProto`` that large can be held in memory but not serialized,
so ONNX's shape inference, its version converter and ``InferenceSession(bytes)`` cannot take it, and every
copy of it costs its full size in memory (an LLM's weights are most of a machine's RAM).

Such a model is split once into a *skeleton* (the whole graph, its small tensors inline) and one file
holding its large tensors, which the skeleton's initializers reference as external data. Every stage runs on
the skeleton; onnxruntime maps that one file for every validation session instead of holding a copy per
session; the data is put back only into the model handed back to the caller. A model read from a path whose
weights are already in files is its own skeleton (:meth:`DetachedWeights.kept_in`): nothing is copied, and
its weights are read only to be streamed into the result's file."""

from __future__ import annotations

import functools
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
"""Weights above this (protobuf's hard limit is 2 GiB for the whole message) are saved outside the model and
validated with one run: each further run of a multi-GB model costs its size again."""

DETACH_BYTES = 64 << 20
"""Weights above this are kept out of the stages (:class:`DetachedWeights`): the e-graph, the IR and every
onnxruntime session then hold a skeleton, and onnxruntime maps the weights from one file. Whole, a model's
weights were copied by each stage and each session: 5.4 GB at the peak for a 0.75 GB model, 2.7 GB detached
(``experiments/bench_memory.py``)."""

SMALL_TENSOR = 1 << 16
"""A skeleton keeps the data of tensors below this inline: shape constants, scales, masks, RoPE tables — what
the stages read to reason about the graph."""

_ALIGNMENT = 1 << 16
"""Offsets in the weights file: onnxruntime maps external data only at its allocation granularity (4 KiB on
Linux, 64 KiB on Windows); elsewhere it reads a private copy."""


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node holds in its attributes (an ``If``'s branches, a ``Loop``'s or ``Scan``'s body)."""
    return [graph for attr in node.attribute
            for graph in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs)]  # fmt: skip


def tensor_bytes(tensor: onnx.TensorProto, *, external_too: bool = False) -> int:
    """The size of a tensor's data held in the proto (or, ``external_too``, in a file), from its dims (reading
    ``raw_data`` would copy it)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL and not external_too:
        return 0
    itemsize = item_bytes(tensor.data_type)
    return math.prod(tensor.dims) * (8 if itemsize is None else itemsize)


@functools.cache
def item_bytes(data_type: int) -> int | None:
    """Bytes an element of an ONNX data type takes as numpy holds it (None: numpy has no type for it), looked up
    once per type: onnx's mapping is slow to ask per value (a 48-layer BERT's memory estimate asks 2,244 times)."""
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None


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


def external_bytes(model: onnx.ModelProto) -> int:
    """The size of the main graph's initializers stored in files, from their dims."""
    stored = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    return sum(tensor_bytes(t, external_too=True) for t in stored)


def read_inline(tensor: onnx.TensorProto, folder: Path) -> None:
    """Put the bytes of ``tensor``, stored in a file in ``folder`` (which the loader checked), inline."""
    info = {e.key: e.value for e in tensor.external_data}
    with open(folder / info["location"], "rb") as data:
        data.seek(int(info.get("offset") or 0))
        tensor.raw_data = data.read(int(info["length"])) if info.get("length") else data.read()
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT


def is_large(model: onnx.ModelProto) -> bool:
    return weight_bytes(model) > LARGE_BYTES


def weight_bytes(model: onnx.ModelProto) -> int:
    return sum(tensor_bytes(t) for t in _tensors(model))


def _detachable(tensor: onnx.TensorProto) -> bool:
    return tensor.data_type != onnx.TensorProto.STRING and tensor_bytes(tensor) >= SMALL_TENSOR


class DetachedWeights:
    """A large model's skeleton and the file its large tensors were written to; a context manager that
    deletes the file.

    Large ``Constant`` values become initializers of the same name in the skeleton (a file reference needs
    an initializer; the computation is the same), so the model handed back has them as initializers."""

    FILE = "weights.bin"

    def __init__(self, model: onnx.ModelProto) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="egfuse-weights-"))
        self.owned = True  # the folder is egfuse's: removed on close
        self.lifted = 0
        self._sources: dict[str, onnx.TensorProto] = {}  # name → the caller's tensor, to copy back from
        self.large = is_large(model)  # past protobuf's limit: saved outside, validated with one run
        try:
            self.skeleton = self._split(model)
        except BaseException:
            self.close()
            raise

    @classmethod
    def kept_in(cls, model: onnx.ModelProto, folder: Path) -> DetachedWeights:
        """``model``'s large tensors as they already are: in files in the user's ``folder`` (checked by the
        loader), which is never written to nor removed."""
        self = cls.__new__(cls)
        self.directory, self.owned, self.lifted, self._sources = Path(folder), False, 0, {}
        self.large = weight_bytes(model) + external_bytes(model) > LARGE_BYTES
        self.skeleton = model
        return self

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

    def restore(self, proto: onnx.ModelProto) -> onnx.ModelProto:
        """``proto`` (made from the skeleton) with the weights it references put back inline: copied from the
        caller's model (in C++, without the transient Python ``bytes`` reading the file would make), or read
        from the user's files for a model that kept them there. The weights are then held twice until the
        caller's model is dropped (clearing its fields would not help: protobuf's upb backend frees a message's
        memory only with the whole message)."""
        for tensor in proto.graph.initializer:
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            source = self._sources.get(tensor.name)
            if source is not None:
                name = tensor.name
                tensor.CopyFrom(source)
                tensor.name = name  # a Constant's value may carry another name, or none
            elif not self.owned:
                read_inline(tensor, self.directory)
        return proto

    def close(self) -> None:
        if self.owned:
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


def save_with_external_data(
    model: onnx.ModelProto, path: Path, *, data_name: str | None = None, weights_folder: Path | None = None
) -> Path:
    """Write ``model`` to ``path`` with its weights in ``data_name`` (default ``<name>.data``) beside it, without
    the in-memory copy ``onnx.save_model`` makes (onnx-ir streams each tensor to the file). Large ``Constant``
    values become initializers first: only those can live outside the file, and left inline they can push it
    past 2 GB. A model whose every tensor is tiny still gets its weights file: asked for one, a caller expects
    to find it. Tensors ``model`` keeps in files are read from ``weights_folder``, mapped, one at a time."""
    model_ir = ir.serde.deserialize_model(model)
    if weights_folder is not None:
        ir.external_data.set_base_dir(model_ir.graph, weights_folder)
    LiftConstantsToInitializersPass(size_limit=SMALL_TENSOR // 4)(model_ir)
    ir.save(
        model_ir,
        path,
        external_data=data_name or f"{path.name}.data",
        size_threshold_bytes=_INLINE_BYTES if _any_tensor_over(model_ir, _INLINE_BYTES) else 0,
    )
    return path


_INLINE_BYTES = 256
"""Tensors below this stay in the model file (onnx-ir's default): shape constants, scales."""


def _any_tensor_over(model: ir.Model, size: int) -> bool:
    return any(v.const_value is not None and v.const_value.nbytes >= size for v in model.graph.initializers.values())


_PROBE_INLINE_BYTES = 1 << 16
"""Initializers below this stay in the copy shape inference reads (shape constants, scales); larger ones are
stood in for by typed inputs, so inferring never copies a model's weights."""


def _large_constant(node: onnx.NodeProto, inline_bytes: int) -> onnx.TensorProto | None:
    """The tensor a ``Constant`` node holds, when it is too large to copy into a probe."""
    value = _constant_value(node)
    if value is None or len(node.output) != 1 or tensor_bytes(value) < inline_bytes:
        return None
    return value


def inference_probe(
    model: onnx.ModelProto,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    inline_bytes: int = _PROBE_INLINE_BYTES,
) -> onnx.ModelProto:
    """A copy of the graph for shape inference: large weights (initializers and ``Constant`` nodes) stood in for
    by typed inputs — their values are never needed, and a model over 2 GB cannot be serialized whole for onnx's
    checker —, graph inputs fixed to ``input_shapes`` where given. The nodes' ``metadata_props`` are left out:
    neither inference nor the checker reads them, and a dynamo export's source map was 60% of a 48-layer
    BERT's probe (inference on it 0.05 s → 0.015 s)."""
    graph = model.graph
    probe = onnx.ModelProto()
    probe.ir_version = model.ir_version
    probe.opset_import.extend(model.opset_import)
    probe.functions.extend(model.functions)
    probe.graph.name = graph.name
    for node in graph.node:
        weight = _large_constant(node, inline_bytes)
        if weight is None:
            probe.graph.node.append(node)
            if node.metadata_props:  # a dynamo export's source map: most of a graph without its weights
                del probe.graph.node[-1].metadata_props[:]
        else:  # exporters (onnxscript's models) ship weights as Constant nodes, as large as initializers
            probe.graph.input.append(onnx.helper.make_tensor_value_info(node.output[0], weight.data_type, weight.dims))
    probe.graph.output.extend(graph.output)
    for value in graph.input:
        fixed = probe.graph.input.add()
        fixed.CopyFrom(value)
        if input_shapes and value.name in input_shapes:
            shape = fixed.type.tensor_type.shape
            del shape.dim[:]
            for size in input_shapes[value.name]:
                shape.dim.add().dim_value = int(size)
    inputs = {value.name for value in graph.input}
    for tensor in graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL and tensor_bytes(tensor) < inline_bytes:
            probe.graph.initializer.append(tensor)
        elif tensor.name not in inputs:
            probe.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    return probe
