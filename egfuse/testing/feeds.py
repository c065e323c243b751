"""Inputs for generated models, with real padding (and left padding on request)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper


def feeds_for(
    model: onnx.ModelProto, seed: int = 0, batch: int = 2, seq: int = 5, left_padding: bool = False
) -> dict[str, np.ndarray]:
    """Random inputs with real padding: the last sequence's final position is masked out.

    ``left_padding`` also masks the first two positions of the first sequence (a left-padded batch): under a
    causal mask its first query rows then see no key at all — the fully masked rows whose meaning (the mean
    of V, or of the keys a select fill ties with) fused kernels must keep.

    Keys/values of cross-attention (``kv_seq``) are two positions longer than the queries, so a mix-up of
    the two lengths cannot pass unnoticed."""
    rng = np.random.default_rng(seed)
    sizes = {"batch": batch, "seq": seq, "kv_seq": seq + 2, "past_seq": 3, "total_seq": seq + 3}
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        tensor_type = inp.type.tensor_type
        dims = [
            d.dim_value
            if d.HasField("dim_value")
            else int(d.dim_param)
            if d.dim_param.isdigit()
            else sizes[d.dim_param]
            for d in tensor_type.shape.dim
        ]
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if tensor_type.elem_type == TensorProto.INT64:  # 1 = attend, 0 = padding
            m = np.ones(dims, np.int64)
            m[-1, -1] = 0
            if left_padding:
                m[0, :2] = 0
            feeds[inp.name] = m
        elif tensor_type.elem_type == TensorProto.BOOL:
            m = np.ones(dims, bool)
            m[-1, ..., -1] = False
            if left_padding:
                m[0, ..., :2] = False
            feeds[inp.name] = m
        elif inp.name == "mask":
            m = np.zeros(dims, dtype)
            m[-1, ..., -1] = -10000.0
            if left_padding:
                m[0, ..., :2] = -10000.0
            feeds[inp.name] = m
        else:
            feeds[inp.name] = rng.standard_normal(dims).astype(dtype)
    return feeds
