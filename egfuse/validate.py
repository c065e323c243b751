"""Numerical proof on onnxruntime: the fused model against the original, on generated feeds.

Feeds are built so attention is exercised as in real use: symbolic dims bound to small distinct sizes,
integer masks with real padding (0s at the end of the second sequence), token ids inside the embedding
table. Region outputs keep their names through fusion, so one run compares every region separately and a
failing region can be rolled back alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort

ATOL = 1e-4
RTOL = 1e-3
HALF_TOLERANCE = 1e-2
"""float16/bfloat16 outputs: ~10 ulps of float16 (absolute and relative). The fused op rounds its
intermediates differently from the unfused graph (one rounding of the scores instead of several), which
costs a few ulps on its own."""

_DIM_SIZES = {"batch": 2}
_DEFAULT_DIM = 5


@dataclass
class Comparison:
    name: str
    max_abs_diff: float
    ok: bool


def bind_dim(name: str, sizes: dict[str, int]) -> int:
    if name in sizes:
        return sizes[name]
    lowered = name.lower()
    for key, size in _DIM_SIZES.items():
        if key in lowered:
            sizes[name] = size
            return size
    # A "total" length (KV cache: past + new tokens) is the sum of the past and new lengths.
    if "total" in lowered:
        past = bind_dim(next((k for k in sizes if "past" in k.lower()), "past_sequence"), sizes)
        new = bind_dim(next((k for k in sizes if "total" not in k.lower() and "past" not in k.lower()
                             and "batch" not in k.lower()), "sequence"), sizes)  # fmt: skip
        sizes[name] = past + new
        return sizes[name]
    # Sums such as "past_sequence_length + sequence_length" follow from their parts.
    parts = [p.strip() for p in re.split(r"\+", name)]
    if len(parts) > 1:
        sizes[name] = sum(bind_dim(p, sizes) for p in parts)
        return sizes[name]
    sizes[name] = _DEFAULT_DIM + len([k for k in sizes if "+" not in k and k != name]) % 3
    return sizes[name]


def _vocab_size(model: onnx.ModelProto, input_name: str) -> int | None:
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == input_name:
            table = inits.get(node.input[0])
            if table is not None and table.dims:
                return int(table.dims[0])
    return None


def make_feeds(model: onnx.ModelProto, seed: int = 0, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = dict(dims or {})
    init_names = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        if inp.name in init_names:
            continue
        tt = inp.type.tensor_type
        shape = [
            d.dim_value if d.HasField("dim_value") else bind_dim(d.dim_param or f"unk_{inp.name}_{i}", sizes)
            for i, d in enumerate(tt.shape.dim)
        ]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        name = inp.name.lower()
        if np.issubdtype(dtype, np.floating):
            data = rng.standard_normal(shape).astype(dtype)
            if "mask" in name:
                data = _padding(shape).astype(dtype)
        elif dtype == np.bool_:
            data = _padding(shape).astype(bool)
        elif "mask" in name:
            data = _padding(shape).astype(dtype)
        elif "position" in name and shape:
            data = np.broadcast_to(np.arange(shape[-1]), shape).astype(dtype)
        else:
            high = _vocab_size(model, inp.name) or 2
            data = rng.integers(0, high, size=shape).astype(dtype)
        feeds[inp.name] = data
    return feeds


def _padding(shape: list[int]) -> np.ndarray:
    """1 = attend, 0 = padding; the last row of the batch has its final position padded."""
    mask = np.ones(shape)
    if len(shape) >= 2 and shape[-1] > 1:
        mask[shape[0] - 1, ..., shape[-1] - 1] = 0
    elif len(shape) == 1 and shape[0] > 1:
        mask[-1] = 0
    return mask


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` that also returns the named intermediate values."""
    extra = onnx.ModelProto()
    extra.CopyFrom(model)
    present = {o.name for o in extra.graph.output}
    for name in names:
        if name not in present:
            extra.graph.output.append(onnx.ValueInfoProto(name=name))
    return extra


def run(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], outputs: list[str] | None = None
) -> dict[str, np.ndarray]:
    probe = with_outputs(model, outputs) if outputs else model
    sess = session(probe)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def compare(name: str, expected: np.ndarray, actual: np.ndarray) -> Comparison:
    if expected.shape != actual.shape:
        return Comparison(name, float("inf"), False)
    if not np.issubdtype(expected.dtype, np.floating):
        same = bool(np.array_equal(expected, actual))
        return Comparison(name, 0.0 if same else float("inf"), same)
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    both_nan = np.isnan(e) & np.isnan(a)
    diff = np.where(both_nan, 0.0, np.abs(e - a))
    diff = np.where(np.isnan(diff), np.inf, diff)
    worst = float(diff.max()) if diff.size else 0.0
    half = np.finfo(expected.dtype).bits <= 16
    atol, rtol = (HALF_TOLERANCE, HALF_TOLERANCE) if half else (ATOL, RTOL)
    ok = bool(np.all(diff <= atol + rtol * np.nan_to_num(np.abs(e), posinf=0.0)))
    return Comparison(name, worst, ok)
