"""Hardware targets: which constructors each can run, what they cost, how a fused term becomes ONNX.

A target is a cost model (``None`` = cannot run) plus emitters for the fused constructors it runs. The
primitive constructors raise the same way for every target (see :mod:`egfuse.raise_`).
"""

from __future__ import annotations

from egfuse.targets.base import Target
from egfuse.targets.onnx import OnnxTarget
from egfuse.targets.ort import OrtTarget

TARGETS: dict[str, type[Target]] = {"onnx": OnnxTarget, "ort": OrtTarget}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]()
    except KeyError:
        raise ValueError(f"unknown target {name!r}; choose one of: {', '.join(TARGETS)}") from None


__all__ = ["TARGETS", "Target", "get_target"]
