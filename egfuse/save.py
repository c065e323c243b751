"""Save: a fused model written so that a crash leaves the old file or the new one, never half of one."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import onnx

from egfuse import protos


def save_model(model: onnx.ModelProto, path: Path, *, external_data: bool | None = None) -> None:
    path = Path(path)
    if external_data is None:
        external_data = protos.is_large(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        staged = workdir / path.name
        if external_data:  # streamed tensor by tensor: no second copy of the weights in memory
            protos.save_with_external_data(model, staged)
        else:
            onnx.save_model(model, staged)
        data = workdir / f"{path.name}.data"
        if data.exists():
            os.replace(data, path.parent / data.name)
        os.replace(staged, path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
