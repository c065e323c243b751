"""What every target shares: the cost of primitive ops, and the interface raising calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from egfuse.session import ENode

if TYPE_CHECKING:
    import onnx_ir as ir

    from egfuse.raise_ import Emitter

# Relative cost of one op: roughly the passes over memory it makes. A MatMul reads and writes the most;
# views (reshape meanings) are free at run time. Canonical forms (scores, probs) are never emitted.
# repeat_heads writes K or V `times` over (Expand + Reshape): more than one transpose of them.
PRIMITIVE_COSTS: dict[str, float] = {
    "value": 0.0, "no_bias": 0.0, "full_like": 0.1, "zero_bias": 0.1,
    "matmul": 10.0, "softmax": 4.0,
    "add": 2.0, "sub": 2.0, "mul": 2.0, "div": 2.0, "where": 2.0, "isnan": 1.0, "sqrt": 1.0, "cast": 1.0,
    "nan_to_zero": 3.0, "transpose": 2.0,
    "repeat_heads": 3.0, "reshape": 0.5, "split_heads": 0.5, "merge_heads": 0.5, "merge_lead": 0.5, "split_lead": 0.5,
}  # fmt: skip

FUSED = frozenset({"attend", "attend_z", "mha", "gqa", "mha_kv4", "packed_attention"})
"""Constructors that are one fused attention op when emitted."""

STANDARD_ATTENTION_OPSET = 23
"""The default-domain opset that defines the standard ``Attention`` op."""

DOMAIN_OPSETS = {"": STANDARD_ATTENTION_OPSET, "com.microsoft": 1}
"""The opset each domain of a fused op needs imported."""


class Target:
    name: ClassVar[str]
    description: ClassVar[str]
    fused_costs: ClassVar[dict[str, float]]

    def cost(self, node: ENode) -> float | None:
        if node.op in PRIMITIVE_COSTS:
            return PRIMITIVE_COSTS[node.op]
        return self.fused_costs.get(node.op)

    def rotary_embedding(self) -> str | None:
        """Why this target writes no ``RotaryEmbedding`` op, or None where it writes the standard one (opset
        23). The standard op is the one both targets run: on onnxruntime 1.31's CPU it took 0.35-0.78× the
        time of the rotate-half subgraph it replaces, and 0.54-0.84× of ``com.microsoft.RotaryEmbedding``'s
        (experiments/bench_rotary.py)."""
        return None

    def mask_fill(self, fill: float, dtype: np.dtype) -> float:
        """The number to write for a select mask's fill so every kernel computes what the graph did.

        onnxruntime's standard ``Attention`` reads a mask entry equal to ``lowest`` (finfo.min) as −inf and
        gives 0 for a query row masked entirely that way, where the primitive ops give the mean of V. One ulp
        above ``lowest`` means the same to the graph's algebra (added to any score it still rounds to the fill
        itself, so a fully masked row stays uniform) and to every kernel, so all targets write that — for a mask
        made of fills alone: next to another term that may hold ``lowest`` (a padding mask) the moved fill would
        break their tie, so the emitter writes the fill as it is there (``Emitter.mark_exact_fills``) and the
        standard op gets the whole mask moved instead (``Emitter.finite_mask``)."""
        lowest = np.finfo(dtype).min if np.issubdtype(dtype, np.floating) else None
        if lowest is not None and fill == float(lowest):
            return float(np.nextafter(lowest, dtype.type(0)))
        return fill

    def emit(self, node: ENode, emitter: Emitter) -> ir.Value:
        raise NotImplementedError(f"{self.name} cannot emit {node.op}")

    def op_name(self, node: ENode) -> str:
        """The fused op this target writes for ``node`` (for reports)."""
        raise NotImplementedError

    def op_domain(self, node: ENode) -> str:
        """The domain of the fused op written for ``node`` ("" is the standard one)."""
        return ""

    def op_label(self, node: ENode) -> str:
        domain = self.op_domain(node)
        return f"{domain}.{self.op_name(node)}" if domain else self.op_name(node)
