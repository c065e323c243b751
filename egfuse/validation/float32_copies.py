"""Float32 copies of a half-precision model, for judging what it computes where its own precision cannot be run.

Two places need them: a half-precision original that onnxruntime's CPU provider refuses for want of kernels
(bfloat16 models mostly; float16 ones where an op has no float16 kernel, such as a ScatterND that adds: the whole
check then runs on the copies), and the mask-exercising feeds of a float16 model, where a fully masked row is the
fill's rounding in half precision but has one answer once widened (:mod:`egfuse.validation.judge`). Kept apart from
the judge because deciding *when* a copy says something true of the model is its own question: the fills stay at
float32's ends (a float16 fill at finfo.min moved there, :func:`egfuse.validation.widen.upcast`), so the copies
keep what masks mean; bfloat16 also has float32's exponent range, so they keep what overflows mean too.
"""

from __future__ import annotations

import onnx

from egfuse.files import protos
from egfuse.validation import validate
from egfuse.validation.widen import HALF_TYPES

FLOAT32_COPIES_NOTE = (
    "validated on float32 copies of both models: onnxruntime's CPU provider has no half-precision kernels for some "
    "of this model's ops, so what each fused region computes is checked, and the half type's own rounding (the "
    "kernel's) is not"
)


def float32_copies(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    feeds: dict | None,
    weights: protos.DetachedWeights | None,
    err: Exception,
) -> tuple[onnx.ModelProto, onnx.ModelProto, dict | None] | None:
    """Float32 copies of both models (and the feeds) where onnxruntime refused a half-precision original for want
    of kernels — its CPU provider runs few bfloat16 ops and not every float16 one, the GPUs that run such models
    do. The copies keep what the masks' fills mean, and only the rounding is the kernel's. None for any other
    failure, for a model without half-precision values, and for a model past protobuf's limit (the copies would
    cost its weights twice more)."""
    if not not_the_inputs(err) or not _holds_half(original) or (weights is not None and weights.large):
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


def _holds_half(model: onnx.ModelProto) -> bool:
    graph = model.graph
    infos = [*graph.input, *graph.output, *graph.value_info]
    return any(v.type.tensor_type.elem_type in HALF_TYPES for v in infos) or any(
        t.data_type in HALF_TYPES for t in graph.initializer
    )


def not_the_inputs(err: Exception) -> bool:
    """onnxruntime refused the graph when making the session (an op it has no kernel for, an invalid graph) or a
    kernel refused the element type when running it (onnxruntime's CPU ScatterND adds no float16): no input is at
    fault."""
    text = str(err)
    return any(sign in text for sign in _KERNEL_REFUSALS)


_KERNEL_REFUSALS = ("Load model", "NOT_IMPLEMENTED", "INVALID_GRAPH", "Could not find an implementation",
                    "data type is not supported")  # fmt: skip
