"""What the shape, shape-vector and bound rules ask of the facts, as a protocol.
:class:`egfuse.analysis.facts.GraphFacts` answers these questions and calls those rules while it evaluates a graph, so
the rules depend on the questions alone: the dependency runs one way (facts → rules → this protocol), with no import
cycle, even for type checking."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import onnx_ir as ir

from egfuse.analysis.dims import Dim, Shape
from egfuse.analysis.weight_summary import Summary


class FactQueries(Protocol):
    """The queries of :class:`egfuse.analysis.facts.GraphFacts` (see there for what each answers)."""

    def const(self, value: ir.Value | None) -> np.ndarray | None: ...

    def weight(self, value: ir.Value | None) -> np.ndarray | None: ...

    def scalar(self, value: ir.Value | None) -> float | None: ...

    def elems(self, value: ir.Value | None) -> tuple[Dim | None, ...] | None: ...

    def flags(self, value: ir.Value | None) -> tuple[bool, ...] | None: ...

    def shape(self, value: ir.Value | None) -> Shape | None: ...

    def reshape_spec(self, node: ir.Node) -> tuple[Dim | int | None, ...] | None: ...

    def summary(self, value: ir.Value | None) -> Summary | None: ...

    def finite(self, value: ir.Value | None) -> bool: ...

    def magnitude(self, value: ir.Value | None) -> float | None: ...

    def finite_magnitude(self, value: ir.Value | None) -> float | None: ...
