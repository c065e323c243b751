"""Load a model from a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model`` — or say precisely why not."""

from __future__ import annotations

import math
import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import BinaryIO

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from egfuse.errors import EgfuseError, ExternalDataError
from egfuse.files import protos, well_formed

MIN_OPSET = 7  # Softmax/MatMul semantics this old are what the rules assume from here on
MAX_OPSET = onnx.defs.onnx_opset_version()

ModelLike = str | os.PathLike | onnx.ModelProto | ir.Model


@dataclass
class LoadedModel:
    proto: onnx.ModelProto
    source: str  # a path or "<ModelProto>"
    external_data: bool = False  # weights were stored outside the .onnx file: keep them outside
    files: tuple[Path, ...] = ()  # the files it was read from (the model, its weights): outputs must spare them
    weights_folder: Path | None = None
    """Where ``proto``'s large tensors still are: a model whose weights are all in files is never read whole
    (every stage works on the graph, onnxruntime maps the files, the result's weights are streamed from them)."""
    owned: bool = False
    """``proto`` was made here (read from a file, serialized from IR, reordered): no caller holds it, so a stage
    may change it in place where it would otherwise copy it (and must undo that where it is handed back)."""

    @property
    def opset(self) -> int:
        return default_opset(self.proto)


def default_opset(proto: onnx.ModelProto) -> int:
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    return 0


def load(model: ModelLike) -> LoadedModel:
    if isinstance(model, onnx.ModelProto):
        loaded = _from_proto(model)
    elif isinstance(model, ir.Model):
        loaded = _from_ir(model)
    elif isinstance(model, str | os.PathLike):
        loaded = _load_path(Path(model))
    else:
        raise EgfuseError(f"expected a path, onnx.ModelProto or onnx_ir.Model, got {type(model).__name__}")
    _check(loaded)
    order = well_formed.check(loaded.proto, loaded.source)
    if order != sorted(order):
        loaded.proto, loaded.owned = _sorted(loaded.proto, order), True
    return loaded


def _sorted(proto: onnx.ModelProto, order: list[int]) -> onnx.ModelProto:
    """A copy of ``proto`` (the caller's stays as it is) with its nodes in ``order``: every stage after this
    one reads a graph in the order it runs."""
    nodes = list(proto.graph.node)
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    del copy.graph.node[:]
    copy.graph.node.extend(nodes[i] for i in order)
    return copy


def _load_path(path: Path) -> LoadedModel:
    if not path.exists():
        raise EgfuseError("no such file", path=str(path))
    if path.is_dir():
        raise EgfuseError("is a directory, expected an .onnx file", path=str(path))
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise EgfuseError(f"not a readable ONNX model (truncated or not protobuf): {err}", path=str(path)) from None
    if not proto.graph.node and not proto.graph.output:
        raise EgfuseError("not an ONNX model: it has no graph", path=str(path))
    # Weights already in files stay there (only small tensors are read: what the stages reason about), unless
    # large tensors are inline too: then all are read, and kept apart in one file of egfuse's own (protos).
    keep = protos.SMALL_TENSOR if protos.weight_bytes(proto) <= protos.DETACH_BYTES else None
    weights = read_external_data(proto, path.parent, str(path), keep_from=keep)
    folder = path.parent if keep is not None and _external_tensors(proto) else None
    return LoadedModel(proto, str(path), bool(weights), (path, *weights), folder, owned=True)


def model_files(path: Path) -> tuple[Path, ...]:
    """The files a model at ``path`` is read from: itself, then the weights files its tensors name. Read before
    a long run so that outputs can be checked against them; a model that cannot be read here is reported by
    :func:`load`, so any failure gives just ``path``."""
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # not a model, not a file: load() says which, in its own words
        return (path,)
    locations = dict.fromkeys(_location(t) for t in _external_tensors(proto))
    return (path, *(path.parent / loc for loc in locations if loc))


def read_external_data(
    proto: onnx.ModelProto, folder: Path, source: str, *, keep_from: int | None = None
) -> tuple[Path, ...]:
    """Put the bytes of every tensor stored outside ``proto`` inline, read from files in ``folder`` — only
    there: a location may not leave it (absolute, ``..``, a symlink out), and its span must lie in the file and
    hold exactly the tensor's bytes, so a wrong or stray file is an error, not silently different weights.
    Initializers of the main graph of ``keep_from`` bytes or more are checked alike but left in their files.
    Returns the files the tensors are in."""
    tensors = _external_tensors(proto)
    kept = {id(t) for t in proto.graph.initializer} if keep_from is not None else set()
    files: dict[Path, BinaryIO | None] = {}
    with ExitStack() as stack:
        for tensor in tensors:
            file = _external_file(tensor, folder, source)
            offset, length = _external_span(tensor, file, source)
            if id(tensor) in kept and length >= keep_from:
                files.setdefault(file, None)
                continue
            if files.get(file) is None:
                files[file] = stack.enter_context(_open_weights(file, source))
            files[file].seek(offset)
            tensor.raw_data = files[file].read(length)
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT
    return tuple(files)


def _external_tensors(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    tensors = onnx.external_data_helper._get_all_tensors(proto)
    return [t for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL]


def _location(tensor: onnx.TensorProto) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


def _external_file(tensor: onnx.TensorProto, folder: Path, source: str) -> Path:
    """The file ``tensor``'s data is in, refused unless it is a regular file inside ``folder``."""
    location = _location(tensor)
    what = f"tensor {tensor.name!r} keeps its data in {location!r}"

    def refuse(reason: str) -> ExternalDataError:
        return ExternalDataError(f"{what}, {reason}", path=source)

    if not location:
        raise ExternalDataError(f"tensor {tensor.name!r} is stored outside the model but names no file", path=source)
    if os.path.isabs(location) or PureWindowsPath(location).anchor:
        raise refuse("an absolute path: weights must be in the model's folder")
    if ".." in PurePosixPath(location.replace("\\", "/")).parts:
        raise refuse("which leaves the model's folder")
    file = folder / location
    if not os.path.lexists(file):
        raise refuse(f"which does not exist ({file})")
    real, root = file.resolve(), folder.resolve()
    if real != root and root not in real.parents:
        raise refuse(f"a link to {real}, outside the model's folder")
    if not real.is_file():
        raise refuse("which is not a regular file")
    return file


def _external_span(tensor: onnx.TensorProto, file: Path, source: str) -> tuple[int, int]:
    """Where ``tensor``'s bytes are in ``file``, refused unless the span is in the file and its size is the
    size the tensor's type and shape need."""
    info = {e.key: e.value for e in tensor.external_data}
    size = file.stat().st_size
    what = f"tensor {tensor.name!r} in {file.name}"
    try:
        offset = int(info.get("offset") or 0)
        length = int(info["length"]) if info.get("length") else size - offset
    except ValueError:
        raise ExternalDataError(f"{what}: offset/length are not integers", path=source) from None
    if offset < 0 or length < 0 or offset + length > size:
        raise ExternalDataError(
            f"{what}: bytes {offset}..{offset + length} are past the end of the file ({size} bytes)", path=source
        )
    expected = _tensor_nbytes(tensor)
    if expected is not None and length != expected:
        dtype = onnx.TensorProto.DataType.Name(tensor.data_type)
        raise ExternalDataError(
            f"{what}: {length} bytes, but a {dtype} tensor of shape {list(tensor.dims)} has {expected}", path=source
        )
    return offset, length


_PACKED = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2, "FLOAT6E2M3": 6, "FLOAT6E3M2": 6}
_SUB_BYTE_BITS = {
    getattr(onnx.TensorProto, name): bits for name, bits in _PACKED.items() if hasattr(onnx.TensorProto, name)
}
"""Types stored packed, several to a byte (numpy's stand-ins for them take a whole byte each)."""


def _tensor_nbytes(tensor: onnx.TensorProto) -> int | None:
    """The bytes ``tensor``'s type and shape need stored raw; None where that is not fixed (strings)."""
    bits = _SUB_BYTE_BITS.get(tensor.data_type)
    if bits is None:
        if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
            return None
        size = protos.item_bytes(tensor.data_type)
        if size is None:
            return None
        bits = 8 * size
    return (math.prod(tensor.dims) * bits + 7) // 8


def _open_weights(file: Path, source: str) -> BinaryIO:
    try:
        return open(file, "rb")  # closed by the caller's ExitStack
    except OSError as err:
        raise ExternalDataError(f"weights file {file} cannot be read: {err.strerror}", path=source) from None


def _from_proto(model: onnx.ModelProto) -> LoadedModel:
    """An in-memory model: its tensors must hold their data, since nothing says which folder a file it names
    is in (resolving against the current directory reads whatever file happens to be there)."""
    _refuse_unloaded(model, "<ModelProto>", "onnx.load(path), which reads it,")
    return LoadedModel(model, "<ModelProto>")


def _from_ir(model: ir.Model) -> LoadedModel:
    """An onnx_ir model: tensors it has not read yet are read from the folder it was loaded from, which
    ``ir.load`` records only when given a path with a folder in it."""
    source = "<onnx_ir.Model>"
    proto = ir.serde.serialize_model(model)
    if not _external_tensors(proto):
        return LoadedModel(proto, source)
    folders = {t.base_dir for t in _ir_external_tensors(model)}
    if len(folders) != 1 or not next(iter(folders)):
        _refuse_unloaded(proto, source, "ir.load() with the model's full path,")
    folder = Path(next(iter(folders)))
    weights = read_external_data(proto, folder, source)
    return LoadedModel(proto, source, True, weights)


def _ir_external_tensors(model: ir.Model) -> list[ir.ExternalTensor]:
    values = [v.const_value for g in model.graphs() for v in g.initializers.values()]
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        values.extend(a.value for a in node.attributes.values() if a.type == ir.AttributeType.TENSOR)
    return [v for v in values if isinstance(v, ir.ExternalTensor)]


def _refuse_unloaded(proto: onnx.ModelProto, source: str, how: str) -> None:
    tensors = _external_tensors(proto)
    if tensors:
        raise ExternalDataError(
            f"tensor {tensors[0].name!r} keeps its data in {_location(tensors[0])!r}, not loaded, and an in-memory "
            f"model does not say which folder that is in: pass the model's path to fuse(), or load it with {how} "
            "first",
            path=source,
        )


def _check(loaded: LoadedModel) -> None:
    opset = loaded.opset
    if opset == 0:
        raise EgfuseError("the model imports no default-domain (ai.onnx) opset", path=loaded.source)
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise EgfuseError(f"unsupported opset {opset} (supported: {MIN_OPSET}..{MAX_OPSET})", path=loaded.source)
    names: set[str] = set()
    for i, node in enumerate(loaded.proto.graph.node):
        if not node.op_type:
            raise EgfuseError("node has no op_type", path=loaded.source, node=node.name or f"#{i}")
        names.update(o for o in node.output if o)
