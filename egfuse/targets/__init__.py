"""Hardware targets, each one module of data (:class:`~egfuse.targets.spec.TargetSpec`) and one line here.

A target says which fused constructors it can write and how (``FusedOp``), and what running things costs
(``CostParams``); raising (:mod:`egfuse.writers`) and extraction (:mod:`egfuse.cost`) read it. Adding a target
touches nothing but a new module and :data:`TARGETS`.
"""

from __future__ import annotations

from egfuse.errors import UnknownTargetError
from egfuse.targets import npu, onnx, ort
from egfuse.targets.spec import STANDARD_ATTENTION_OPSET, CostParams, FusedOp, TargetSpec

TARGETS: dict[str, TargetSpec] = {spec.name: spec for spec in (ort.SPEC, onnx.SPEC, npu.SPEC)}


def get_target(name: str | TargetSpec) -> TargetSpec:
    """The registered target of that name (a spec given is its own target: a calibrated or restricted one)."""
    if isinstance(name, TargetSpec):
        return name
    try:
        return TARGETS[name]
    except KeyError:
        raise UnknownTargetError(f"unknown target {name!r}; choose one of: {', '.join(TARGETS)}") from None


def targets() -> dict[str, str]:
    """Each target's name and one-line description, in the order the CLI lists them."""
    return {name: spec.description for name, spec in TARGETS.items()}


__all__ = ["STANDARD_ATTENTION_OPSET", "TARGETS", "CostParams", "FusedOp", "TargetSpec", "get_target", "targets"]
