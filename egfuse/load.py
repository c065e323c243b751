"""Load a model from a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model`` — or say precisely why not."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from egfuse.errors import EgfuseError

MIN_OPSET = 7  # Softmax/MatMul semantics this old are what the rules assume from here on
MAX_OPSET = onnx.defs.onnx_opset_version()

ModelLike = str | os.PathLike | onnx.ModelProto | ir.Model


@dataclass
class LoadedModel:
    proto: onnx.ModelProto
    source: str  # a path or "<ModelProto>"
    external_data: bool = False  # weights were stored outside the .onnx file: keep them outside

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
        loaded = LoadedModel(model, "<ModelProto>")
    elif isinstance(model, ir.Model):
        loaded = LoadedModel(ir.serde.serialize_model(model), "<onnx_ir.Model>")
    elif isinstance(model, str | os.PathLike):
        loaded = _load_path(Path(model))
    else:
        raise EgfuseError(f"expected a path, onnx.ModelProto or onnx_ir.Model, got {type(model).__name__}")
    _check(loaded)
    return loaded


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
    external = any(
        t.data_location == onnx.TensorProto.EXTERNAL for t in onnx.external_data_helper._get_all_tensors(proto)
    )
    try:
        onnx.external_data_helper.load_external_data_for_model(proto, str(path.parent))
    except (OSError, ValueError) as err:
        raise EgfuseError(f"external data could not be read: {err}", path=str(path)) from None
    return LoadedModel(proto, str(path), external)


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
