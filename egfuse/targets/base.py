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
PRIMITIVE_COSTS: dict[str, float] = {
    "value": 0.0, "no_bias": 0.0, "full_like": 0.1, "zero_bias": 0.1,
    "matmul": 10.0, "softmax": 4.0,
    "add": 2.0, "sub": 2.0, "mul": 2.0, "div": 2.0, "where": 2.0, "isnan": 1.0, "sqrt": 1.0, "cast": 1.0,
    "nan_to_zero": 3.0, "transpose": 2.0,
    "repeat_heads": 2.0, "reshape": 0.5, "split_heads": 0.5, "merge_heads": 0.5, "merge_lead": 0.5, "split_lead": 0.5,
}  # fmt: skip

FUSED = frozenset({"attend", "attend_z", "mha", "mha_kv4", "packed_attention"})
"""Constructors that are one fused attention op when emitted."""


class Target:
    name: ClassVar[str]
    description: ClassVar[str]
    fused_costs: ClassVar[dict[str, float]]
    opsets: ClassVar[dict[str, int]]  # domain → minimum version the emitted ops need

    def cost(self, node: ENode) -> float | None:
        if node.op in PRIMITIVE_COSTS:
            return PRIMITIVE_COSTS[node.op]
        return self.fused_costs.get(node.op)

    def mask_fill(self, fill: float, dtype: np.dtype) -> float:
        """The number to write for a mask fill so the target's kernel computes what the graph did: a kernel
        may read some values specially (onnxruntime's standard ``Attention`` reads ``lowest`` as −inf)."""
        return fill

    def emit(self, node: ENode, emitter: Emitter) -> ir.Value:
        raise NotImplementedError(f"{self.name} cannot emit {node.op}")

    def op_name(self, node: ENode) -> str:
        """The fused op this target writes for ``node`` (for reports)."""
        raise NotImplementedError
