"""A dynamo export's source map (the nodes' ``metadata_props``) is set aside while the model is fused: the nodes
fusion kept come back with their own entries, the stages never see them, and a model whose node names cannot
bring them back goes through with its metadata, as it came."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import egfuse
import egfuse.api
from egfuse.files import node_metadata

EXPORT = Path(__file__).parents[1] / "data" / "bart_encoder_eager.dynamo.onnx"


@pytest.fixture(scope="module")
def export() -> onnx.ModelProto:
    if not EXPORT.exists():
        pytest.skip(f"{EXPORT.name} is not in this checkout")
    model = onnx.load(str(EXPORT))
    assert sum(len(node.metadata_props) for node in model.graph.node) > 0, "the export lost its source map"
    return model


def _entries(node: onnx.NodeProto) -> list[tuple[str, str]]:
    return [(p.key, p.value) for p in node.metadata_props]


def _outputs(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_kept_nodes_keep_their_entries_and_the_stages_see_none(export, monkeypatch):
    seen = []
    inner = egfuse.api.fuse_loaded

    def spy(loaded, *args, **kwargs):
        seen.append(sum(len(node.metadata_props) for node in loaded.proto.graph.node))
        return inner(loaded, *args, **kwargs)

    monkeypatch.setattr(egfuse.api, "fuse_loaded", spy)
    result = egfuse.fuse(export, target="ort")
    assert result.report.fused >= 1 and result.report.validated
    assert seen == [0]
    given = {node.name: node for node in export.graph.node}
    kept = [node for node in result.model.graph.node if node.name in given]
    assert kept, "fusion kept no node of the input"
    for node in kept:
        assert _entries(node) == _entries(given[node.name]), node.name
    written = [node for node in result.model.graph.node if node.name not in given]
    assert written and not any(node.metadata_props for node in written)
    assert sum(len(node.metadata_props) for node in export.graph.node) > 0  # the caller's model untouched
    feeds = dict(np.load(EXPORT.with_name(EXPORT.name.replace(".onnx", ".feeds.npz"))))
    for want, got in zip(_outputs(export, feeds), _outputs(result.model, feeds), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)


def test_a_model_nothing_fused_in_comes_back_as_given(export):
    result = egfuse.fuse(export, target="ort", rotary=False, budgets=egfuse.Budgets(max_iterations=0))
    assert result.report.fused == 0
    assert result.model is export


def test_a_model_read_from_a_file_is_stripped_in_place_and_handed_back_whole(export, monkeypatch):
    """Read from a path, the model is egfuse's own: the entries are taken off it without a copy, and where
    nothing is fused it comes back with every node's entries as the file holds them."""
    in_place = []
    inner = node_metadata.set_aside

    def spy(model, **kwargs):
        lean, aside = inner(model, **kwargs)
        in_place.append(lean is model and aside is not None)
        return lean, aside

    monkeypatch.setattr(egfuse.api.node_metadata, "set_aside", spy)
    result = egfuse.fuse(str(EXPORT), target="ort", rotary=False, budgets=egfuse.Budgets(max_iterations=0))
    assert result.report.fused == 0 and in_place == [True], "set aside in place: no copy of the model"
    assert [_entries(n) for n in result.model.graph.node] == [_entries(n) for n in export.graph.node]
    fused = egfuse.fuse(str(EXPORT), target="ort")
    assert in_place == [True, True]
    given = {node.name: node for node in export.graph.node}
    kept = [node for node in fused.model.graph.node if node.name in given]
    assert fused.report.fused >= 1 and kept
    assert all(_entries(node) == _entries(given[node.name]) for node in kept)
    egfuse.fuse(export, target="ort", rotary=False, budgets=egfuse.Budgets(max_iterations=0))
    assert in_place[-1] is False, "the caller's model is never changed"


def test_names_that_cannot_bring_entries_back_leave_the_metadata_on(export):
    twice = onnx.ModelProto()
    twice.CopyFrom(export)
    twice.graph.node[1].name = twice.graph.node[0].name
    lean, aside = node_metadata.set_aside(twice)
    assert lean is twice and aside is None
    unnamed = onnx.ModelProto()
    unnamed.CopyFrom(export)
    unnamed.graph.node[0].name = ""
    assert node_metadata.set_aside(unnamed) == (unnamed, None)


def test_a_node_of_another_op_under_a_kept_name_gets_nothing(export):
    lean, aside = node_metadata.set_aside(export)
    assert aside is not None
    assert not any(node.metadata_props for node in lean.graph.node)
    first = next(node for node in export.graph.node if node.metadata_props)
    other = onnx.ModelProto()
    other.CopyFrom(lean)
    renamed = next(node for node in other.graph.node if node.op_type != first.op_type)
    renamed.name = first.name
    aside.put_back(other)
    assert not renamed.metadata_props
    same = next(node for node in other.graph.node if node.name == first.name and node.op_type == first.op_type)
    assert _entries(same) == _entries(first)
