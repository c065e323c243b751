"""What running a model on onnxruntime will hold in memory, known before it runs — so validation can keep to a
budget instead of being killed for memory (a model with a huge static sequence length materialises a
(B, N, S, S) score tensor per layer).

The estimate is an upper bound: the weights held in memory (a large model's are mapped from a file, and count
nothing here) plus every intermediate value at its size under the feeds' shapes, as ONNX shape inference
gives them — onnxruntime frees a value once its last reader ran, so its peak is below the sum. Values whose
size shape inference cannot tell count nothing; the largest known value is named in the message."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from egfuse.files import protos
from egfuse.preparation.shape_inference import filled_at_newer_opset

DEFAULT_BUDGET_BYTES = 4 << 30
"""4 GiB: what validation may hold, unless the caller says otherwise."""


@dataclass(frozen=True)
class Estimate:
    bytes: int
    largest: str  # "name (shape dtype)", the single largest value

    def describe(self) -> str:
        return f"about {size_text(self.bytes)} (largest value: {self.largest})"


def size_text(count: int) -> str:
    """Bytes for people: ``3.2 GiB``, ``512 MiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.1f} {unit}"
    return f"{count} bytes"


class OverBudget(Exception):
    """Running the model would hold more than the budget; the message says how much and what."""


def estimate(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, weights_mapped: bool = False) -> Estimate:
    probe = _shapes_under(model, feeds)
    total, largest, largest_name = 0, 0, "none"
    if not weights_mapped:
        total += sum(protos.tensor_bytes(t) for t in model.graph.initializer)
    for info in [*probe.graph.value_info, *probe.graph.output]:
        size = _bytes(info)
        total += size
        if size > largest:
            dims = [d.dim_value for d in info.type.tensor_type.shape.dim]
            dtype = onnx.TensorProto.DataType.Name(info.type.tensor_type.elem_type).lower()
            largest, largest_name = size, f"{info.name} {dims} {dtype}"
    return Estimate(total, largest_name)


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], budget: int | None, *, weights_mapped: bool) -> None:
    """Raise :class:`OverBudget` where running ``model`` on ``feeds`` would hold more than ``budget`` bytes."""
    if budget is None:
        return
    found = estimate(model, feeds, weights_mapped=weights_mapped)
    if found.bytes > budget:
        raise OverBudget(
            f"running the model on the validation inputs needs {found.describe()}, over the validation memory "
            f"budget of {size_text(budget)}"
        )


def _shapes_under(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of the graph without its large weights, its inputs fixed to the feeds' shapes, shapes inferred."""
    probe = protos.inference_probe(model, {name: np.shape(value) for name, value in feeds.items()})
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, data_prop=True)
    except Exception:  # an estimate from what is known: the graph as it is
        return probe
    # An older opset's shape arithmetic leaves onnx's data propagation behind (a TorchScript export at opset 13:
    # every Reshape's output unknown, so a (B, N, S, S) score tensor counted nothing): read it off a newer copy.
    return filled_at_newer_opset(inferred)


def _bytes(info: onnx.ValueInfoProto) -> int:
    tensor = info.type.tensor_type
    if not tensor.HasField("shape") or not tensor.elem_type:
        return 0
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    if None in dims:
        return 0
    return math.prod(dims) * (protos.item_bytes(tensor.elem_type) or 0)
