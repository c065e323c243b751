"""onnxruntime: its contrib ops ``com.microsoft.MultiHeadAttention`` and packed-QKV ``Attention``, and the
standard ``Attention`` (opset 23) where K/V are (B, N, T, H) tensors — grouped-query heads included, which no
contrib op takes without a proof that the mask is causal (GroupQueryAttention always masks causally).

Which of the equal forms runs fastest depends on the onnxruntime version, the execution provider and the
shapes. The CPU efficiencies are this machine's measurement (``egfuse calibrate --target ort``, see
experiments/cost_model.py); the CUDA provider's were measured on an H100 (experiments/bench_gpu.py), where the
contrib ops run about twice as fast as the standard ``Attention`` and a primitive node costs a kernel launch,
and are used when validation names that provider (``--provider CUDAExecutionProvider``: :data:`PROVIDERS`).
Where the model cannot be raised to opset 23 the standard ops drop out and grouped K/V heads are repeated for
MultiHeadAttention."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources

from egfuse.targets.onnx import SPEC as ONNX
from egfuse.targets.onnx import STANDARD
from egfuse.targets.spec import (
    BIAS_GELU,
    GELU,
    GELU_CONTRIB,
    NORM_OPS,
    ROTARY,
    SKIP_LAYER_NORM,
    SKIP_RMS_NORM,
    STANDARD_ATTENTION_OPSET,
    FusedOp,
    TargetSpec,
)

CONTRIB = {"domain": "com.microsoft", "opset": 1, "zero_scale_is_default": True}

UNCALIBRATED = TargetSpec(
    name="ort",
    description="onnxruntime: com.microsoft MultiHeadAttention / packed-QKV Attention, standard Attention for 4D K/V",
    ops=(
        FusedOp("packed_attention", "Attention", "packed_qkv", softcap=False, **CONTRIB),
        FusedOp("mha", "MultiHeadAttention", "multi_head", softcap=False, **CONTRIB),
        FusedOp("mha_kv4", "MultiHeadAttention", "multi_head", softcap=False, efficiency=0.9, **CONTRIB),
        *(FusedOp(c, "Attention", **STANDARD) for c in ("attend", "attend_z", "gqa", "mha_standard")),
        *NORM_OPS,
        SKIP_LAYER_NORM,
        SKIP_RMS_NORM,
        GELU_CONTRIB,
        BIAS_GELU,
        ROTARY,
    ),
    costs=ONNX.costs,
    rule_families=("ort",),
)

PROFILE = resources.files("egfuse") / "data" / "ort_profile.json"
"""This machine's measurement (``egfuse calibrate --target ort``), shipped as the default."""

CPU_WHOLE_MODEL_LOSERS = frozenset({"packed_attention", "skip_layer_norm", "skip_rms_norm", "bias_gelu", "gelu"})
"""Contrib forms that lose whole models to the standard ops on onnxruntime's CPU provider, measured side by side
on the same exports with every other op the same (12 interleaved rounds, ratios to the unfused export):
packed-QKV Attention, which wins single-block timings at S ≥ 256 (results/cost_model.md), ran BERT S=512 at
0.903 against 0.857 with the standard ``Attention``; on ViT S=512 SkipLayerNormalization cost 3%
(0.923 → 0.890 without it), BiasGelu 0.5% and the contrib Gelu 1.5% against the standard one (0.885 → 0.870);
Whisper-encoder S=512 ran at 1.018 with the skip norm and BiasGelu and 0.976 without. Priced for the CPU, the
ort target offers them only where the standard ops cannot be written (``--keep-opset``, a model onnx's
converter cannot raise); priced for CUDA, where they are among the fastest kernels, always. (MultiHeadAttention
stays: it is the form a block falls back to when the standard op's reading of a fully masked row fails
validation. With the others gone, BERT at S=128 still ran 2% behind the onnx target, whose only difference was
the standard op on (B, S, N·H) inputs where the ort target wrote it on (B, N, S, H) between head transposes:
``mha`` is the contrib op's constructor here. So ``mha`` is also ``mha_standard`` (:mod:`egfuse.rules.ort`), the
standard op on that layout: on the CPU the ort target now writes, on all ten rows of results/latency.md, the graph
the onnx target writes, byte for byte.)"""
CPU = replace(
    UNCALIBRATED,
    # the standard Gelu with the standard Attention: written where the model is raised to opset 23 for them
    ops=(
        *(op for op in UNCALIBRATED.ops if op.constructor not in CPU_WHOLE_MODEL_LOSERS),
        replace(GELU, opset=STANDARD_ATTENTION_OPSET),
    ),
    below_opset_ops=tuple(op for op in UNCALIBRATED.ops if op.constructor in CPU_WHOLE_MODEL_LOSERS),
)
SPEC = CPU.with_profile(json.loads(PROFILE.read_text())) if PROFILE.is_file() else CPU

CUDA_PROFILE = resources.files("egfuse") / "data" / "ort_cuda_profile.json"
"""The CUDA provider's measurement (experiments/bench_gpu.py on an H100, float16 blocks and their bfloat16
twins: ``form@bfloat16`` entries)."""

CUDA_BFLOAT16 = frozenset(
    {
        "mha",
        "mha_kv4",
        "mha_standard",
        "packed_attention",
        "attend",
        "attend_z",
        "gqa",
        "rms_norm",
        "layer_norm",
        "skip_layer_norm",
        "skip_rms_norm",
        "gelu",
        "bias_gelu",
        "rotary",
    }
)
"""Forms whose op onnxruntime's CUDA provider ran in bfloat16 (an H100, onnxruntime-gpu 1.31.1: the bfloat16 BERT
and Llama exports fused by onnxscript and by egfuse, the bfloat16 attention blocks the CUDA profile is fitted on,
and one-op probes of Gelu, BiasGelu and the norms; experiments/results/latency_gpu.md). Without the Gelu the
bfloat16 BERT ran at 0.61 of the unfused export, with it at 0.38; a model that loads nowhere is worse than one
left unfused, so an op joins this set only once it was seen to run."""


def _on_cuda(op: FusedOp) -> FusedOp:
    if op.constructor == "mha_kv4":  # CUDA's MultiHeadAttention refuses a cache beside (B, N, T, H) keys
        op = replace(op, absorbs_cache=False)
    return replace(op, dtypes=op.dtypes | {"bfloat16"}) if op.constructor in CUDA_BFLOAT16 else op


CUDA_UNCALIBRATED = replace(
    UNCALIBRATED,
    description=UNCALIBRATED.description + " (costs of onnxruntime's CUDA provider)",
    keep_unfused=True,  # a decode step's few small kernels beat the standard op's launch on CUDA (measured)
    ops=tuple(_on_cuda(op) for op in UNCALIBRATED.ops),
)
CUDA_SPEC = (
    CUDA_UNCALIBRATED.with_profile(json.loads(CUDA_PROFILE.read_text()))
    if CUDA_PROFILE.is_file()
    else CUDA_UNCALIBRATED
)

PROVIDERS = {"CUDAExecutionProvider": CUDA_SPEC}
"""The target as priced for an execution provider other than the CPU's (:func:`egfuse.targets.for_provider`)."""
