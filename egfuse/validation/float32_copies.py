"""Float32 copies of a half-precision model, for judging what it computes where its own precision cannot be run.

Two places need them: a bfloat16 original that onnxruntime's CPU provider refuses for want of kernels (the
whole check then runs on the copies), and the mask-exercising feeds of a float16 model, where a fully masked row
is the fill's rounding in half precision but has one answer once widened (:mod:`egfuse.validation.judge`). Kept apart
from the judge because deciding *when* a copy says something true of the model is its own question: bfloat16 has
float32's exponent range and the fills stay at float32's ends, so the copies keep what masks and overflows mean.
"""

from __future__ import annotations

import onnx

from egfuse.files import protos
from egfuse.validation import validate

FLOAT32_COPIES_NOTE = (
    "validated on float32 copies of both models: onnxruntime's CPU provider has no bfloat16 kernels for this model, "
    "so what each fused region computes is checked, and bfloat16's own rounding (the kernel's) is not"
)


def float32_copies(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    feeds: dict | None,
    weights: protos.DetachedWeights | None,
    err: Exception,
) -> tuple[onnx.ModelProto, onnx.ModelProto, dict | None] | None:
    """Float32 copies of both models (and the feeds) where onnxruntime refused a bfloat16 original for want of
    kernels — its CPU provider runs few bfloat16 ops, the GPUs that run such models do. bfloat16 has float32's
    exponent range, so the copies keep what the masks' fills and every overflow mean, and only the rounding
    is the kernel's. None for any other failure, for a model without bfloat16 values, and for a model past
    protobuf's limit (the copies would cost its weights twice more)."""
    if not does_not_load(err) or not _holds_bfloat16(original) or (weights is not None and weights.large):
        return None
    wide_original, wide_fused = widened_copies(original, fused, weights)
    return wide_original, wide_fused, validate.upcast_feeds(feeds, fills=True) if feeds is not None else None


def widened_copies(
    original: onnx.ModelProto, fused: onnx.ModelProto, weights: protos.DetachedWeights | None
) -> list[onnx.ModelProto]:
    """Float32 copies of both models, their weights put back, a half type's fills kept at float32's ends."""
    wide = []
    for model in (original, fused):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        wide.append(validate.upcast(weights.restore(copy) if weights is not None else copy, fills=True))
    return wide


def _holds_bfloat16(model: onnx.ModelProto) -> bool:
    graph = model.graph
    infos = [*graph.input, *graph.output, *graph.value_info]
    return any(v.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16 for v in infos) or any(
        t.data_type == onnx.TensorProto.BFLOAT16 for t in graph.initializer
    )


def does_not_load(err: Exception) -> bool:
    """onnxruntime refused the graph when making the session (an op it has no kernel for, an invalid graph),
    not the inputs when running it."""
    text = str(err)
    return any(
        sign in text for sign in ("Load model", "NOT_IMPLEMENTED", "INVALID_GRAPH", "Could not find an implementation")
    )
