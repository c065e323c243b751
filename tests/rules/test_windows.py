"""Attention over an extra leading (window) axis, (B, W, N, S, H) — Twins' locally grouped attention — is
attention on the folded (B·W) batch (``rules/windows.py``): it fuses and matches the original, also where the
number of windows is known only when the graph runs (TorchScript's Twins: its padding makes hg·wg symbolic), the
fold split again by the count read off an operand's shape. K and V shared by every window (broadcast along W)
are no such attention and stay as written."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import egfuse
from egfuse.testing import disagreements

from ..conftest import DATA, fast_on, fused_export, fused_op_count

B, W, N, S, H = 2, 3, 2, 4, 8


def _windowed(kv_windows: int | str = W, windows: int | str = W) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 2, 4, 3]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
        helper.make_node("Transpose", ["o"], ["y"], perm=[0, 1, 3, 2, 4]),
    ]
    inputs = [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, ["batch", windows, N, S, H]),
        helper.make_tensor_value_info("k", TensorProto.FLOAT, ["batch", kv_windows, N, S, H]),
        helper.make_tensor_value_info("v", TensorProto.FLOAT, ["batch", kv_windows, N, S, H]),
    ]
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [1 / np.sqrt(H)])
    graph = helper.make_graph(
        nodes, "windows", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [scale]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(kv_windows: int = W, windows: int = W) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "q": rng.standard_normal((B, windows, N, S, H)).astype(np.float32),
        "k": rng.standard_normal((B, kv_windows, N, S, H)).astype(np.float32),
        "v": rng.standard_normal((B, kv_windows, N, S, H)).astype(np.float32),
    }


@pytest.mark.parametrize("target", fast_on("ort"))
def test_windowed_attention_fuses_on_the_folded_batch(target: str):
    model, feeds = _windowed(), _feeds()
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert fused_op_count(result.model, target) == 1
    assert not disagreements(model, result.model, feeds)


@pytest.mark.parametrize("target", fast_on("onnx"))
def test_a_window_count_known_at_run_time_is_read_from_the_graph(target: str):
    """W a symbol: the folded batch is split again by Shape(q)[1], so any count runs (5 windows here, where
    validation drew its own)."""
    model = _windowed(kv_windows="windows", windows="windows")
    result = egfuse.fuse(model, target=target)
    assert result.report.fused == 1, str(result.report)
    assert result.report.validated is True, str(result.report)
    assert fused_op_count(result.model, target) == 1
    feeds = _feeds(kv_windows=5, windows=5)
    assert not disagreements(model, result.model, feeds)


@pytest.mark.parametrize("target", fast_on("onnx", ("ort", "onnx", "npu")))
def test_twins_torchscript_windows_fuse(target: str):
    """timm's Twins by TorchScript: the locally grouped blocks' window count hg·wg is symbolic (computed pads
    before the window view), and all 4 blocks fuse and match on the export's own feeds (2 before)."""
    file = "producers/timm/twins_eager.torchscript.onnx"
    result = fused_export(file, target)
    assert result.report.fused == 4, str(result.report)
    assert result.report.validated is True, str(result.report)
    feeds = dict(np.load(DATA / file.replace(".onnx", ".feeds.npz")))
    assert not disagreements(onnx.load(DATA / file), result.model, feeds)


def test_keys_shared_by_every_window_are_not_folded():
    model, feeds = _windowed(kv_windows=1), _feeds(kv_windows=1)
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert result.report.fused == 0, str(result.report)
    assert not disagreements(model, result.model, feeds)


def _shifted(mask_batch: int | str = 1) -> onnx.ModelProto:
    """Swin's shifted windows: scores on the folded (B·W) batch, a per-window mask added to them viewed as
    (B, W, N, S, S), folded back, softmax, ·V."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["s"]),
        helper.make_node("Reshape", ["s", "per_window"], ["s5"]),
        helper.make_node("Add", ["s5", "mask"], ["masked5"]),
        helper.make_node("Reshape", ["masked5", "folded"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    folded = ["batch_windows", N, S, H]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, folded) for n in "qkv"]
    inits = [
        helper.make_tensor("scale", TensorProto.FLOAT, [], [1 / np.sqrt(H)]),
        helper.make_tensor("per_window", TensorProto.INT64, [5], [-1, W, N, S, S]),
        helper.make_tensor("folded", TensorProto.INT64, [4], [-1, N, S, S]),
    ]
    if mask_batch == 1:  # a stored (1, W, 1, S, S) buffer of 0 and −100, as timm builds it
        rng = np.random.default_rng(1)
        values = np.where(rng.random((1, W, 1, S, S)) < 0.3, -100.0, 0.0).astype(np.float32)
        inits.append(helper.make_tensor("mask", TensorProto.FLOAT, values.shape, values.reshape(-1)))
    else:  # a mask per batch row and window: no tiling makes it one
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [mask_batch, W, 1, S, S]))
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "shifted", inputs, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _shifted_feeds(mask_batch: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((B * W, N, S, H)).astype(np.float32) for n in "qkv"}
    if mask_batch != 1:
        feeds["mask"] = np.where(rng.random((B, W, 1, S, S)) < 0.3, -100.0, 0.0).astype(np.float32)
    return feeds


@pytest.mark.parametrize("target", fast_on("onnx"))
def test_a_per_window_mask_is_a_mask_of_the_folded_batch(target: str):
    model, feeds = _shifted(), _shifted_feeds()
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert fused_op_count(result.model, target) == 1
    assert "Tile" in {n.op_type for n in result.model.graph.node}
    assert not disagreements(model, result.model, feeds)


def test_a_mask_per_batch_row_is_not_tiled():
    model, feeds = _shifted(mask_batch="batch"), _shifted_feeds(mask_batch=B)
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert "Tile" not in {n.op_type for n in result.model.graph.node}
    assert not disagreements(model, result.model, feeds)


def _blocked(mask: str) -> onnx.ModelProto:
    """LongT5's local attention, without its neighbouring blocks: Q, K and V (B, W, S, N, H) — the sequence cut
    into W blocks of S — read by two Einsums with an ellipsis over (B, W), K as (…, H, T) for the scores, and
    ``mask``: "per block" a (B, W, 1, S, S) mask of each block's keys, "shared" a (1, 1, N, S, S) bias every
    block adds, "both" their sum as LongT5 adds it."""
    nodes = [helper.make_node("Einsum", ["q", "k"], ["qk"], equation="...qhd,...khd->...hqk")]
    if mask == "both":
        nodes.append(helper.make_node("Add", ["bias", "block_mask"], ["m"]))
    term = {"per block": "block_mask", "shared": "bias", "both": "m"}[mask]
    nodes += [
        helper.make_node("Add", ["qk", term], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("Einsum", ["p", "v"], ["y"], equation="...hqk,...khd->...qhd"),
    ]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "blocks", S, N, H]) for name in "qkv"]
    if mask != "shared":
        inputs.append(helper.make_tensor_value_info("block_mask", TensorProto.FLOAT, ["batch", "blocks", 1, S, S]))
    rng = np.random.default_rng(1)
    bias = helper.make_tensor("bias", TensorProto.FLOAT, [1, 1, N, S, S], rng.standard_normal(N * S * S).tolist())
    graph = helper.make_graph(nodes, "blocked", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [bias] if mask != "per block" else [])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("mask", ["per block", "shared", "both"])
def test_blocked_attention_read_by_einsums_with_an_ellipsis_fuses(mask: str):
    """An Einsum's ``...`` is the leading axes it stands for; a term added over the same two leading axes, or
    over two unit ones, is added to the folded scores; a rank-5 transpose keeping the leading axes keeps the
    batch dim the MatMul's operands compare. Before: "recognition stopped at Einsum"."""
    model = _blocked(mask)
    rng = np.random.default_rng(2)
    feeds = {n: rng.standard_normal((B, W, S, N, H)).astype(np.float32) for n in "qkv"}
    if mask != "shared":  # the last block's last two keys masked (padding), with a finite fill
        block = np.zeros((B, W, 1, S, S), np.float32)
        block[:, -1, :, :, -2:] = -1e10
        feeds["block_mask"] = block
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert [n.op_type for n in result.model.graph.node].count("Attention") == 1
    assert not disagreements(model, result.model, feeds)
