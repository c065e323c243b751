"""egfuse as an onnx-ir pass, so it composes with ``ir.passes.Sequential`` like any other pass.

import onnx_ir as ir, egfuse.passes
model = ir.load("model.onnx")
result = ir.passes.Sequential(egfuse.passes.FuseAttentionPass(target="ort"))(model)
"""

from __future__ import annotations

import onnx_ir as ir

from egfuse.api import Budgets, fuse
from egfuse.report import Report


class FuseAttentionPass(ir.passes.InPlacePass):
    """Fuse attention in place. The last report is kept on ``self.report``."""

    def __init__(self, target: str = "ort", *, validate: bool = True, budgets: Budgets | None = None) -> None:
        super().__init__()
        self.target = target
        self.validate = validate
        self.budgets = budgets
        self.report: Report | None = None

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        result = fuse(model, target=self.target, validate=self.validate, budgets=self.budgets)
        self.report = result.report
        if not result.report.fused:
            return ir.passes.PassResult(model, modified=False)
        fused = ir.serde.deserialize_model(result.model)
        # In place: the caller's Model object takes the fused graph (which carries the opset imports).
        model.graph = fused.graph
        model.ir_version = fused.ir_version
        return ir.passes.PassResult(model, modified=True)
