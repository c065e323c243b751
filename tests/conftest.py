"""Shared helpers: every fusion test checks numerics against the unfused model on onnxruntime."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest

import egfuse
from egfuse import validate
from egfuse.targets import TargetSpec, get_target

DATA = Path(__file__).parent / "data"
PEER = Path(__file__).resolve().parents[2] / "shared" / "peer-graphs" / "ort"
TOLERANCE = 1e-4


def assert_same_outputs(original: onnx.ModelProto, fused: onnx.ModelProto, feeds: dict, atol: float = TOLERANCE):
    """Run both models on onnxruntime CPU and compare every graph output."""
    expected = validate.run(original, feeds)
    actual = validate.run(fused, feeds)
    assert expected.keys() == actual.keys()
    for name in expected:
        e, a = expected[name], actual[name]
        assert e.shape == a.shape, name
        diff = np.abs(e.astype(np.float64) - a.astype(np.float64))
        diff = np.where(np.isnan(e) & np.isnan(a), 0.0, diff)
        assert np.nanmax(diff) <= atol, f"{name}: max abs diff {np.nanmax(diff):.3g} > {atol}"
        assert not np.isnan(diff).any(), f"{name}: NaN where the original has a number"


def feature_model(nodes: list, inits: list, name: str, width: int, output: str = "output") -> onnx.ModelProto:
    """A float32 graph from ``input`` to ``output``, both (batch, seq, width): the frame the norm and GELU tests
    put their spellings in (opset 18, IR 9)."""
    shape = ["batch", "seq", width]
    graph = onnx.helper.make_graph(
        nodes,
        name,
        [onnx.helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, shape)],
        [onnx.helper.make_tensor_value_info(output, onnx.TensorProto.FLOAT, shape)],
        inits,
    )
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=9)


def topologically_sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with nodes a test appended put back in topological order."""
    import onnx_ir as ir

    ir_model = ir.serde.deserialize_model(model)
    ir_model.graph.sort()
    return ir.serde.serialize_model(ir_model)


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        key = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
        counts[key] = counts.get(key, 0) + 1
    return counts


FUSED_OPS = {"onnx": "Attention", "ort": ("com.microsoft.Attention", "com.microsoft.MultiHeadAttention", "Attention")}


def fused_op_count(model: onnx.ModelProto, target: str) -> int:
    counts = op_counts(model)
    names = FUSED_OPS[target]
    names = (names,) if isinstance(names, str) else names
    return sum(counts.get(n, 0) for n in names)


def fuse_one_block(model: onnx.ModelProto, target: str, feeds: dict) -> egfuse.FuseResult:
    """``model``'s one attention block fused for ``target`` and validated on ``feeds``, as one fused op."""
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert result.report.validated is True, str(result.report)
    assert fused_op_count(result.model, target) == 1
    return result


def only(target: str, *forms: str) -> TargetSpec:
    """``target`` able to write only ``forms`` (e-graph constructors): for tests of one op's writing, which the
    calibrated costs would otherwise choose by the shapes."""
    spec = get_target(target)
    offered = (*spec.ops, *spec.below_opset_ops)  # a form the target offers only below opset 23 too
    return dataclasses.replace(spec, ops=tuple(op for op in offered if op.constructor in forms), below_opset_ops=())


@pytest.fixture(params=["ort", "onnx"])
def target(request) -> str:
    return request.param
