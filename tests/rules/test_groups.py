"""Grouped-query attention written one group at a time (``rules/groups.py``): Keras' einsum
``btkgh,bskh->bkgts`` as tf2onnx lowers it — the N = K·G query heads viewed as (B, K, G, T, H), stacked as the
rows of a (B·K, G·T, H) batched MatMul against each group's KV head, the scores viewed back as (B, K, G, T, S)
for a (B, 1, 1, T, S) mask and the softmax. Hand-written graphs: the spelling fuses into one grouped-query op
and matches the original; the near misses (the groups read in the other order, a mask that differs per KV
head) are not proven."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import egfuse
from egfuse.testing import disagreements

from ..conftest import fused_op_count, one_target_fast

B, T, K, G, H = 2, 5, 2, 3, 8
N = K * G
FILL = -1e9


def _const(name: str, values: list[int]) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)


def _graph(
    group_perm: tuple[int, ...] = (0, 2, 3, 1, 4, 5), mask_groups: int = 1, zeroed: bool = True, kv: int = K
) -> onnx.ModelProto:
    """tf2onnx's grouped einsum around a select-masked softmax. ``group_perm`` moves the query's (B, T, K, G, 1, H)
    to (B, K, G, T, 1, H) (swap K and G for the near miss); ``mask_groups``: the mask's K axis (1: shared);
    ``kv``: the number of KV heads K (the N = K·G query heads fixed)."""
    K, G = kv, N // kv
    inits = [
        helper.make_tensor("scale", TensorProto.FLOAT, [], [1 / np.sqrt(H)]),
        helper.make_tensor("fill", TensorProto.FLOAT, [], [FILL]),
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        _const("q5_shape", [0, 0, K, G, H]),
        _const("q3_shape", [B * K, G * T, H]),
        _const("k3_shape", [B * K, T, H]),
        _const("v3_shape", [B * K, H, T]),
        _const("s6_shape", [B, K, G, T, T, 1]),
        _const("p3_shape", [B * K, G * T, T]),
        _const("o6_shape", [B, K, G, T, H, 1]),
        _const("o4_shape", [0, 0, N, H]),
        _const("y_shape", [0, 0, N * H]),
        _const("ax4", [4]),
        _const("ax5", [5]),
        _const("ax12", [1, 2]),
        _const("ax23", [2, 3]),
    ]
    node = helper.make_node
    nodes = [
        node("Mul", ["q", "scale"], ["qs"]),
        node("Reshape", ["qs", "q5_shape"], ["q5"]),  # (B, T, K, G, H)
        node("Unsqueeze", ["q5", "ax4"], ["q6"]),  # (B, T, K, G, 1, H)
        node("Transpose", ["q6"], ["q6t"], perm=list(group_perm)),  # (B, K, G, T, 1, H)
        node("Reshape", ["q6t", "q3_shape"], ["q3"]),  # (B·K, G·T, H)
        node("Unsqueeze", ["k", "ax12"], ["k6"]),  # (B, 1, 1, S, K, H)
        node("Transpose", ["k6"], ["k6t"], perm=[0, 4, 1, 2, 3, 5]),  # (B, K, 1, 1, S, H)
        node("Reshape", ["k6t", "k3_shape"], ["k3"]),  # (B·K, S, H)
        node("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
        node("MatMul", ["q3", "k3t"], ["s3"]),  # (B·K, G·T, S)
        node("Reshape", ["s3", "s6_shape"], ["s6"]),
        node("Squeeze", ["s6", "ax5"], ["s5"]),  # (B, K, G, T, S)
        node("Cast", ["m"], ["mf"], to=TensorProto.FLOAT),
        node("Not", ["m"], ["nm"]),
        node("Cast", ["nm"], ["nmf"], to=TensorProto.FLOAT),
        node("Mul", ["s5", "mf"], ["kept"]),  # tf2onnx's SelectV2(m, S, F): m·S + ¬m·F
        node("Mul", ["nmf", "fill"], ["filled"]),
        node("Add", ["kept", "filled"], ["masked"]),
        node("Softmax", ["masked"], ["p"], axis=-1),
    ]
    if zeroed:  # Keras' Softmax(mask): where(m, p, 0), as tf2onnx writes it
        nodes += [
            node("Mul", ["p", "mf"], ["pk"]),
            node("Mul", ["nmf", "zero"], ["p0"]),
            node("Add", ["pk", "p0"], ["pz"]),
        ]
    else:
        nodes.append(node("Identity", ["p"], ["pz"]))
    nodes += [
        node("Unsqueeze", ["pz", "ax4"], ["p6"]),  # (B, K, G, T, 1, S)
        node("Reshape", ["p6", "p3_shape"], ["p3"]),  # (B·K, G·T, S)
        node("Unsqueeze", ["v", "ax23"], ["v6"]),  # (B, S, 1, 1, K, H)
        node("Transpose", ["v6"], ["v6t"], perm=[0, 4, 2, 3, 5, 1]),  # (B, K, 1, 1, H, S)
        node("Reshape", ["v6t", "v3_shape"], ["v3"]),  # (B·K, H, S)
        node("Transpose", ["v3"], ["v3t"], perm=[0, 2, 1]),  # (B·K, S, H)
        node("MatMul", ["p3", "v3t"], ["o3"]),  # (B·K, G·T, H)
        node("Reshape", ["o3", "o6_shape"], ["o6"]),
        node("Squeeze", ["o6", "ax5"], ["o5"]),  # (B, K, G, T, H)
        node("Transpose", ["o5"], ["o5t"], perm=[0, 3, 1, 2, 4]),  # (B, T, K, G, H)
        node("Reshape", ["o5t", "o4_shape"], ["o4"]),  # (B, T, N, H)
        node("Reshape", ["o4", "y_shape"], ["y"]),
    ]
    inputs = [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, [B, T, N, H]),
        helper.make_tensor_value_info("k", TensorProto.FLOAT, [B, T, kv, H]),
        helper.make_tensor_value_info("v", TensorProto.FLOAT, [B, T, kv, H]),
        helper.make_tensor_value_info("m", TensorProto.BOOL, [B, mask_groups, 1, T, T]),
    ]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, T, N * H])]
    graph = helper.make_graph(nodes, "grouped_einsum", inputs, out, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(mask_groups: int = 1, kv: int = K) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {
        "q": rng.standard_normal((B, T, N, H)).astype(np.float32),
        "k": rng.standard_normal((B, T, kv, H)).astype(np.float32),
        "v": rng.standard_normal((B, T, kv, H)).astype(np.float32),
    }
    m = np.tril(np.ones((T, T), bool))[None, None, None].repeat(B, 0).repeat(mask_groups, 1)
    m[1, ..., :2] = False  # left padding in the second sequence: its first rows hide every key
    if mask_groups > 1:
        m[0, -1, ..., 0] = False  # per KV head: the last group's first key hidden too
    feeds["m"] = m
    return feeds


@pytest.mark.parametrize(
    ("target", "zeroed", "kv"),
    one_target_fast([(True, K), (False, K), (True, 1), (True, N)], ["zeroed", "kept", "one_kv_head", "no_grouping"]),
)
def test_grouped_einsum_fuses_and_matches(target: str, zeroed: bool, kv: int):
    """Two KV heads of three query heads each; one KV head (MQA: the groups are the batch split by 1); as many KV
    heads as query heads (groups of one)."""
    model, feeds = _graph(zeroed=zeroed, kv=kv), _feeds(kv=kv)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert fused_op_count(result.model, target) == 1
    assert not disagreements(model, result.model, feeds)


def test_groups_read_in_the_other_order_are_not_proven():
    """Near miss: (B, T, K, G, …) moved to (B, G, K, T, …) stacks query heads of different KV heads as one
    group's rows — a valid graph, but not attention with K/V repeated in place."""
    model, feeds = _graph(group_perm=(0, 3, 2, 1, 4, 5)), _feeds()
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert result.report.fused == 0, str(result.report)
    assert not disagreements(model, result.model, feeds)


def test_a_mask_per_kv_head_is_not_a_mask_of_the_heads():
    """Near miss: a (B, K, 1, T, S) mask broadcasts over each group's G heads, not as one (B, 1, T, S) mask."""
    model, feeds = _graph(mask_groups=K), _feeds(mask_groups=K)
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert result.report.fused == 0, str(result.report)
    assert not disagreements(model, result.model, feeds)
