"""NPUs: attention as single-head attentions (SHA) of plain rank-3 ops, the form NPU toolchains compile well
(``../shared/seeds/004``: an NPU vendor's MHA → SHA transformation).

No fused op: each head is ``softmax(scale · q Kᵀ + mask) V`` on rank-3 tensors split from the projections,
grouped K/V heads read by their query heads without a repeated copy, a KV cache in the split-score form (no
Concat of the cache inside attention), and the mask squeezed to rank 3 once and shared by every head. The
costs make what NPUs do badly expensive — rank-4 Transposes and Where/Select — and rank-3 MatMuls cheap, so
extraction prefers the (B, S, N·H) forms, whose heads split off the projection without a Transpose. The
output is plain ONNX, validated on onnxruntime like every other target's."""

from __future__ import annotations

from egfuse.targets.spec import GELU, NORM_OPS, CostParams, FusedOp, TargetSpec

SHA = "SingleHeadAttention"
"""The report's name for the form (no such op is written: per-head MatMul, Add, Softmax, MatMul)."""
PLAIN = {"broadcasts_batch": True, "dtypes": frozenset({"float32", "float16", "float64", "bfloat16"})}
"""Rank-3 MatMuls broadcast a batch of 1, and plain ops run in whatever type the graph's own ops did."""

SPEC = TargetSpec(
    name="npu",
    description="single-head attention (SHA) of plain rank-3 ops, for NPU toolchains; runs anywhere",
    ops=(
        FusedOp("mha", SHA, "single_head", **PLAIN),  # rank-3 MatMuls broadcast a batch of 1
        FusedOp("gqa", SHA, "single_head", **PLAIN),
        FusedOp("mha_kv4", SHA, "single_head", efficiency=0.8, **PLAIN),  # K/V split on their head axis
        FusedOp("attend", SHA, "single_head", efficiency=0.7, **PLAIN),  # Q too, heads unsqueezed
        FusedOp("attend_z", SHA, "single_head", efficiency=0.7, **PLAIN),
        *NORM_OPS,
        GELU,
    ),
    costs=CostParams(  # a compiled graph: little per node, much per layout change and per rank-4 op
        gflops=2000.0,
        gbytes=50.0,
        op_overhead_us=0.05,
        free_views=True,
        primitive_efficiency={"transpose4": 0.02, "where": 0.05, "nan_to_zero": 0.05, "repeat_heads": 0.05},
        primitive_overhead_us={
            "rank4": 10.0,
            "transpose4": 40.0,
            "where": 20.0,
            "nan_to_zero": 20.0,
            "repeat_heads": 40.0,
        },
    ),
    keep_unfused=True,
    no_rotary="target npu keeps RoPE as the graph's plain ops",
)
