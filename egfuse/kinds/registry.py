"""The region kinds, each one module (:class:`~egfuse.kinds.base.RegionKind`: find its regions, write the
chosen form or explain a miss) and one line here.

The order of :data:`KINDS` is the order regions are lowered and written: attention first, because its writer
reads the graph's own values where the others follow what was written before them
(:meth:`~egfuse.writing.region_writer.RegionWriter.write_chosen`). A kind that ``claims_first`` is found before the
others, so its nodes stay out of their regions.
"""

from __future__ import annotations

from egfuse.kinds import attention, layers, rotary, tanh_gelu
from egfuse.kinds.base import Entry, RegionKey, RegionKind
from egfuse.targets.spec import TargetSpec

KINDS: tuple[RegionKind, ...] = (attention.KIND, layers.KIND, tanh_gelu.KIND, rotary.KIND)


def offered(target: TargetSpec) -> TargetSpec:
    """``target`` with every kind's own fused ops added (:attr:`~egfuse.kinds.base.RegionKind.offer`)."""
    for kind in KINDS:
        if kind.offer is not None:
            target = kind.offer(target)
    return target


def finding_order() -> list[RegionKind]:
    """The kinds in the order their regions are found: those that claim first, then the rest as listed."""
    return sorted(KINDS, key=lambda kind: not kind.claims_first)


__all__ = ["KINDS", "Entry", "RegionKey", "RegionKind", "finding_order", "offered"]
