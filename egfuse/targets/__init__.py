"""Hardware targets, each one module of data (:class:`~egfuse.targets.spec.TargetSpec`) and one line here.

A target says which fused constructors it can write and how (``FusedOp``), and what running things costs
(``CostParams``); raising (:mod:`egfuse.writing.writers`) and extraction (:mod:`egfuse.egraph.cost`) read it. Adding a
target touches nothing but a new module and :data:`TARGETS`.
"""

from __future__ import annotations

from egfuse.errors import UnknownTargetError
from egfuse.targets import npu, onnx, ort
from egfuse.targets.spec import STANDARD_ATTENTION_OPSET, CostParams, FusedOp, TargetSpec

TARGETS: dict[str, TargetSpec] = {spec.name: spec for spec in (ort.SPEC, onnx.SPEC, npu.SPEC)}

BY_PROVIDER: dict[str, dict[str, TargetSpec]] = {"ort": ort.PROVIDERS}
"""A target's variants priced for an execution provider other than the CPU's (its own module's data)."""


def get_target(name: str | TargetSpec) -> TargetSpec:
    """The registered target of that name (a spec given is its own target: a calibrated or restricted one)."""
    if isinstance(name, TargetSpec):
        return name
    try:
        return TARGETS[name]
    except KeyError:
        raise UnknownTargetError(f"unknown target {name!r}; choose one of: {', '.join(TARGETS)}") from None


def for_provider(spec: TargetSpec, providers: tuple[str, ...]) -> TargetSpec:
    """The registered target priced for the first of ``providers`` it has a variant for (the user runs the model
    there: ``--provider``); ``spec`` itself where it has none or is not the registered one (a profile given)."""
    if TARGETS.get(spec.name) is not spec:
        return spec
    variants = BY_PROVIDER.get(spec.name, {})
    return next((variants[p] for p in providers if p in variants), spec)


def targets() -> dict[str, str]:
    """Each target's name and one-line description, in the order the CLI lists them."""
    return {name: spec.description for name, spec in TARGETS.items()}


__all__ = [
    "STANDARD_ATTENTION_OPSET",
    "TARGETS",
    "CostParams",
    "FusedOp",
    "TargetSpec",
    "for_provider",
    "get_target",
    "targets",
]
