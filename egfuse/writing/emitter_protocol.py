"""What a writer may ask of the emitter, as a Protocol: the one thing writers import about it.

The emitter (:class:`~egfuse.writing.raise_.Emitter`) dispatches to the writers (:mod:`egfuse.writing.writers`,
:mod:`egfuse.writing.emit_primitives`, :mod:`egfuse.writing.rotary_write`, …) and hands itself to them; were they to
name the emitter's class, each would import the module that imports them. Naming this contract instead keeps the
dependency one way — the emitter's module imports the writers, never the reverse — and states in one screen the
operations a writer uses: operands read (memoised, the broadcast mask, an absorbed KV cache), nodes written.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts
from egfuse.egraph.extract import Choice
from egfuse.egraph.session import EClass
from egfuse.egraph.shapes import Shape
from egfuse.lowering.lower import Lowered
from egfuse.writing.kv_cache import CacheConcat


class EmitterProtocol(Protocol):
    """The emitter as writers see it (:class:`~egfuse.writing.raise_.Emitter` provides every member)."""

    facts: GraphFacts
    lowered: Lowered
    choice: dict[EClass, Choice]
    shapes: dict[EClass, Shape]
    opset: int
    created: set[ir.Value]
    new_nodes: list[ir.Node]
    also_replace: list[tuple[ir.Value, ir.Value]]
    cache_note: str | None

    # --- nodes (NodeBuilder) ----------------------------------------------------------------------------------
    def node(
        self,
        op: str,
        inputs: list[ir.Value | None],
        attrs: dict[str, object] | None = None,
        domain: str = "",
        like: ir.Value | None = None,
    ) -> ir.Value: ...

    def node_outputs(
        self,
        op: str,
        inputs: list[ir.Value | None],
        attrs: dict[str, object] | None = None,
        domain: str = "",
        like: ir.Value | None = None,
        count: int = 1,
    ) -> list[ir.Value]: ...

    def const(self, array: np.ndarray, hint: str = "const") -> ir.Value: ...

    def initializer(self, array: np.ndarray, hint: str) -> ir.Value: ...

    def shape(self, x: ir.Value, start: int | None = None, end: int | None = None) -> ir.Value: ...

    def split(self, x: ir.Value, sizes: list[int], axis: int) -> list[ir.Value]: ...

    def squeeze(self, x: ir.Value, axis: int) -> ir.Value: ...

    def unsqueeze(self, x: ir.Value, axis: int) -> ir.Value: ...

    # --- operands and what is known of them -------------------------------------------------------------------
    def value(self, cid: EClass) -> ir.Value: ...

    def constant_array(self, cid: EClass) -> np.ndarray: ...

    def rank(self, cid: EClass, emitted: ir.Value) -> int: ...

    def static_dim(self, cid: EClass | None, value: ir.Value, axis: int, what: str) -> int: ...

    def static_dim_or_none(self, cid: EClass | None, value: ir.Value, axis: int) -> int | None: ...

    def lead_count(self, second: str) -> ir.Value: ...

    def float_dtype(self, value: ir.Value) -> np.dtype: ...

    # --- fused ops: operands, mask, KV cache ------------------------------------------------------------------
    def operands(
        self,
        q: EClass,
        k: EClass,
        v: EClass,
        bias: EClass,
        q_axis: int,
        k_axis: int,
        cache_allowed: bool,
        wide: bool = False,
    ) -> tuple[list[ir.Value], ir.Value | None, CacheConcat | None]: ...

    def with_cache(
        self,
        op: str,
        inputs: list[ir.Value | None],
        attrs: dict,
        domain: str,
        like: ir.Value,
        cache: CacheConcat | None,
    ) -> ir.Value: ...

    # --- masks (MaskWriter) -----------------------------------------------------------------------------------
    def bias(
        self,
        cid: EClass,
        query: ir.Value,
        key: ir.Value,
        q_axis: int,
        k_axis: int,
        key_length: tuple[ir.Value, object] | None = None,
        wide: bool = False,
    ) -> ir.Value | None: ...

    def fill_number(self, cid: EClass, fill: float, dtype: np.dtype) -> float: ...

    def wide_value(self, cid: EClass) -> ir.Value: ...

    def widens_for_half(self, cid: EClass) -> bool: ...

    def mark_exact_fills(self, cid: EClass) -> None: ...

    def finite_mask(self, bias: EClass, mask: ir.Value | None) -> ir.Value | None: ...
