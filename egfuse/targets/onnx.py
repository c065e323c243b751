"""The portable target: the standard ``Attention`` op (ONNX opset 23), 4D or 3D, grouped K/V heads native.

onnxruntime's kernel reads a mask entry equal to ``lowest`` (finfo.min) as −inf and gives 0 for a query row
masked entirely that way; raising keeps such rows' meaning (the mean of V) by writing select fills one ulp
above ``lowest``. Fully masked rows filled with −inf still differ (NaN in the graph, 0 in the kernel) and are
rolled back by validation."""

from __future__ import annotations

from dataclasses import replace

from egfuse.targets.spec import GELU, NORM_OPS, ROTARY, STANDARD_ATTENTION_OPSET, CostParams, FusedOp, TargetSpec

MASK_NOTE = (
    "onnxruntime's standard Attention gives 0 for a query row masked entirely with -inf or finfo.min (the primitive "
    "ops give NaN, or the mean of V); select-mask fills are written one ulp above finfo.min to keep the mean (half "
    "of it in float16, where a score added to finfo.min overflows), and validation checks padded inputs"
)
STANDARD = {
    "writer": "standard",
    "opset": STANDARD_ATTENTION_OPSET,
    "positive_scale": True,
    "mask_note": MASK_NOTE,
    "dtypes": frozenset({"float32", "float16", "float64", "bfloat16"}),
}
BFLOAT16 = frozenset({"bfloat16"})
"""The standard ops (Attention, RotaryEmbedding and RMSNormalization 23, LayerNormalization 17, Gelu 20) are
specified for bfloat16 too; onnxruntime's CPU provider has no kernel for them (nor for most ops a bfloat16
model holds), so such a model is validated on float32 copies (:mod:`egfuse.validation.judge`)."""
LAYER_OPS = tuple(replace(op, dtypes=op.dtypes | BFLOAT16) for op in (*NORM_OPS, GELU, ROTARY))

SPEC = TargetSpec(
    name="onnx",
    description="standard ONNX Attention (opset 23), for any runtime that implements it",
    ops=(*(FusedOp(c, "Attention", **STANDARD) for c in ("attend", "attend_z", "mha", "gqa")), *LAYER_OPS),
    costs=CostParams(),
    requires_standard_opset=True,
)
