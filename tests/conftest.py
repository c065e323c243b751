"""Shared helpers: every fusion test checks numerics against the unfused model on onnxruntime."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.targets import TargetSpec, get_target
from egfuse.validation import validate

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
        if not e.size:  # (an empty output: a merged decoder's cross-attention cache on the cached branch)
            continue
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


def with_output_scaled(model: onnx.ModelProto, op_type: str, index: int, factor: float) -> onnx.ModelProto:
    """A copy of ``model`` whose ``index``-th ``op_type`` node's output is ``factor`` times what it was (the factor
    cast like the output, so any float type takes it): a fault a fused op's validation must see."""
    faulty = onnx.ModelProto()
    faulty.CopyFrom(model)
    node = [n for n in faulty.graph.node if n.op_type == op_type][index]
    out = node.output[0]
    node.output[0] = f"{out}_right"
    faulty.graph.initializer.append(onnx.numpy_helper.from_array(np.array(factor, np.float32), "fault"))
    at = list(faulty.graph.node).index(node) + 1
    faulty.graph.node.insert(at, onnx.helper.make_node("CastLike", ["fault", f"{out}_right"], ["fault_t"]))
    faulty.graph.node.insert(at + 1, onnx.helper.make_node("Mul", [f"{out}_right", "fault_t"], [out]))
    return faulty


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


@functools.cache
def fused_export(file: str, target: str) -> egfuse.FuseResult:
    """The export ``DATA/file`` fused for ``target`` and validated on the feeds it was exported with (saved beside
    it), once a session: the tests that check different things of that one fusion share it (fusion is
    deterministic: test_api's test_deterministic_bytes). Callers only read it."""
    path = DATA / file
    feeds = dict(np.load(path.with_name(path.name.replace(".onnx", ".feeds.npz"))))
    return egfuse.fuse(path, target=target, feeds=feeds)


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


def one_target_fast(cases: list[tuple], ids: list[str], targets: tuple[str, ...] = ("ort", "onnx")) -> list:
    """Each case on every target, as ``pytest.param(target, *case)`` with id ``target-id``: the fast suite runs
    each case on one target, the slow suite (``-m slow``, which CI runs) on the others. Case i is fast on target
    ``(i + i // n) % n`` of n: neighbouring cases take the targets in turn, and the turn shifts every n cases,
    so cases listed in pairs (an export by TorchScript, then by dynamo) meet every target in the fast suite too.
    Parametrize ``("target", ...)``: it overrides the ``target`` fixture."""
    n = len(targets)
    params = []
    for i, (case, case_id) in enumerate(zip(cases, ids, strict=True)):
        for j, target in enumerate(targets):
            marks = [] if j == (i + i // n) % n else [pytest.mark.slow]
            params.append(pytest.param(target, *case, marks=marks, id=f"{target}-{case_id}"))
    return params


def fast_on(target: str, targets: tuple[str, ...] = ("ort", "onnx")) -> list:
    """``targets`` for a ``target`` parametrization whose check does not depend on the op a target writes (a
    spelling's recognition, a rotation's proof): the fast suite runs it on ``target``, the slow suite (``-m slow``,
    which CI runs) on the others."""
    return [pytest.param(t, marks=[] if t == target else [pytest.mark.slow]) for t in targets]
