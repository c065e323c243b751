"""What a region kind is: the contract every kind of fused region keeps, so that the search, the judge and the
report treat attention, norms, activations and rotations alike.

A kind finds its regions in the graph (structurally: the rules decide later what each computes), writes the
form extraction chose for one of them, or explains why it stays as written. Its regions are lowered into the one
e-graph, and validation rolls them back by ``(kind name, index)``. A new kind is a module defining one
:class:`RegionKind` and one line in :data:`egfuse.kinds.registry.KINDS`; a kind with a fused op of its own
declares the op's constructors with its rule family (:data:`egfuse.rules.CONSTRUCTORS`) and offers the op to
the targets itself (:attr:`RegionKind.offer`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts
from egfuse.kinds.regions import Region
from egfuse.report import RegionKey, RegionReport, RotaryReport
from egfuse.targets.spec import TargetSpec

if TYPE_CHECKING:
    from egfuse.writing.region_writer import RegionWriter

__all__ = ["Entry", "RegionKey", "RegionKind"]

Entry = RegionReport | RotaryReport
"""A region's line in the report."""


@dataclass(frozen=True)
class RegionKind:
    """One kind of fused region, as functions the search calls in turn."""

    name: str
    """The kind's key in validation (``("attention", 3)``) and in repeated-region matching."""
    report_list: str
    """The :class:`~egfuse.report.Report` list its entries go to (``regions``, ``layer_ops``, ``rotary``)."""
    find: Callable[[ir.Graph, GraphFacts, set[ir.Node], TargetSpec], list[Region]]
    """Its regions in graph order, none holding a node already claimed by a kind found before it."""
    write: Callable[[Region, RegionWriter], Entry]
    """The region's chosen form written over it, or the region kept with the reason: its report entry."""
    claims_first: bool = False
    """Found before every other kind: its outputs are plain values to the others (a rotation's, read by
    attention), so the nodes it holds stay out of their regions."""
    offer: Callable[[TargetSpec], TargetSpec] | None = None
    """The target with the fused ops of this kind's own constructors added (as the target writes a kindred op:
    the tanh GELU where it writes the exact one): a kind brings its ops, the targets need not list them."""
