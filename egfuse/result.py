"""What :func:`egfuse.fuse` hands back: the fused model, its report, and a save that never writes over the
input nor leaves half a model behind."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_ir as ir

from egfuse.files import protos
from egfuse.files.outputs import model_inputs
from egfuse.files.save import save_model
from egfuse.report import Report
from egfuse.version import __version__

__all__ = ["FuseResult", "sign"]


@dataclass
class FuseResult:
    _model: onnx.ModelProto
    report: Report
    _source_external: bool = field(default=False, repr=False)
    """The input kept its weights outside the .onnx file (the result keeps only this of the input: holding the
    input itself would keep a second copy of a large model's weights alive as long as the result)."""
    _inputs: tuple[Path, ...] = field(default=(), repr=False)
    """The files the input was read from (the model, its weights): a save never writes over them."""
    _weights_folder: Path | None = field(default=None, repr=False)
    """Where the result's large tensors still are (the input's own files): read by :attr:`model` on first use,
    streamed from there by :meth:`save`."""

    @property
    def model(self) -> onnx.ModelProto:
        """The fused model, its weights inline. A model whose weights stayed in their files while egfuse worked
        reads them here, once: :meth:`save` does not need to (it streams them into the new weights file)."""
        if self._weights_folder is not None:
            protos.DetachedWeights.kept_in(self._model, self._weights_folder).restore(self._model)
            self._weights_folder = None
        return self._model

    def save(self, path: str | os.PathLike, *, external_data: bool | None = None) -> None:
        """Write atomically: a crash leaves the old model (and weights) at ``path`` or the new, never half of
        one nor a mix (see :mod:`egfuse.files.save`). Weights go to a file beside it, ``<name>.data`` unless that name
        is taken, when the input kept them external (or when asked, or past protobuf's 2 GB). Refuses (an
        :class:`~egfuse.errors.UnsafeOutputError`, nothing written) a path that is an input file or not a
        regular file."""
        if external_data is None and self._source_external:
            external_data = True
        streamed = self._weights_folder is not None and external_data is not False
        save_model(
            self._model if streamed else self.model,
            Path(path),
            external_data=external_data,
            inputs=model_inputs(self._inputs),
            weights_folder=self._weights_folder if streamed else None,
        )

    def to_ir(self) -> ir.Model:
        return ir.serde.deserialize_model(self.model)


def sign(proto: onnx.ModelProto) -> None:
    """The fused model says what wrote it (``producer_name``/``producer_version``); the exporter that made
    the original is kept in ``metadata_props`` (``egfuse.source_producer``)."""
    source = " ".join(p for p in (proto.producer_name, proto.producer_version) if p)
    if source and not any(p.key == "egfuse.source_producer" for p in proto.metadata_props):
        proto.metadata_props.add(key="egfuse.source_producer", value=source)
    proto.producer_name, proto.producer_version = "egfuse", __version__
