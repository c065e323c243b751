"""Repeated regions solved once: the layers of a model go into the e-graph once, each repeat is written from its
representative's program with its own values, and the written model is the one solving every region gives —
also when a repeat cannot be renamed and the search falls back to lowering everything."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import egfuse
from egfuse import repeats, search
from egfuse.analysis.facts import GraphFacts
from egfuse.egraph.certify import LoweredRegion
from egfuse.kinds.regions import Region

from ..conftest import assert_same_outputs

DATA = Path(__file__).parents[1] / "data"


def _fuse(export: str, target: str, *, solve_once: bool) -> egfuse.FuseResult:
    path = DATA / export
    feeds = dict(np.load(path.with_name(path.name.replace(".onnx", ".feeds.npz"))))
    if solve_once:
        return egfuse.fuse(path, target=target, feeds=feeds)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(search, "find_repeats", lambda *a, **k: repeats.find_repeats(*a, **{**k, "solve_once": False}))
        return egfuse.fuse(path, target=target, feeds=feeds)


def _written(result: egfuse.FuseResult) -> tuple:
    model = result.model
    ops = Counter((n.domain, n.op_type) for n in model.graph.node)
    report = result.report
    every_entry = [*report.regions, *report.layer_ops, *report.rotary]
    entries = [(e.index, e.status, e.fused_into, e.reason) for e in every_entry]
    return len(model.graph.node), sorted(ops.items()), entries


@pytest.mark.parametrize(
    ("export", "target"),
    [
        ("whisper_encoder_eager.dynamo.onnx", "ort"),
        ("llama_eager.dynamo.onnx", "onnx"),
        ("bert_sdpa.dynamo.onnx", "ort"),
        # each layer slices the cos/sin tables to the sequence length itself: one slice is written for both layers
        # (the table's class holds a term over values every layer shares: read in place, see repeats.InPlace)
        ("drift/2023-12/llama_eager.torchscript.onnx", "ort"),
    ],
)
def test_repeats_are_loaded_once_and_written_as_before(export, target):
    once = _fuse(export, target, solve_once=True)
    every = _fuse(export, target, solve_once=False)
    assert once.report.fused == every.report.fused > 0, str(once.report)
    assert _written(once) == _written(every)
    assert once.report.stats["enodes_before"] < every.report.stats["enodes_before"]
    feeds = dict(np.load(DATA / export.replace(".onnx", ".feeds.npz")))
    assert_same_outputs(onnx.load(DATA / export), once.model, feeds)


def test_a_repeat_that_cannot_be_renamed_is_solved_with_the_rest(monkeypatch):
    """The fallback: a program reading a value the representative does not hold raises NotRenamed, and the
    search runs again with every region in the e-graph — the same model, not a region lost."""
    every = _fuse("llama_eager.dynamo.onnx", "ort", solve_once=False)
    calls = []

    def refuse(self, index):
        calls.append(index)
        raise repeats.NotRenamed("refused by the test")

    monkeypatch.setattr(repeats._RenamedValues, "__getitem__", refuse)
    once = _fuse("llama_eager.dynamo.onnx", "ort", solve_once=True)
    assert calls, "no repeat was written from its representative: the test does not reach the fallback"
    assert _written(once) == _written(every)
    assert once.report.stats["enodes_before"] == every.report.stats["enodes_before"]


def _value(name: str, dims: list[int]) -> ir.Value:
    return ir.Value(name=name, shape=ir.Shape(dims), type=ir.TensorType(ir.DataType.FLOAT))


def test_same_terms_over_other_shapes_are_not_repeats():
    """The commands state only the dims the rules compare; the cost model and writers read the rest, so a region
    whose values differ in shape is its own representative even where its lone lowering is the same text."""
    facts = GraphFacts(ir.Graph([], [], nodes=[]))
    values = {
        0: (_value("a", [1, 4, 8]), _value("b", [1, 4, 8])),
        1: (_value("c", [1, 4, 8]), _value("d", [1, 4, 8])),
        2: (_value("e", [1, 16, 8]), _value("f", [1, 16, 8])),
    }
    regions = [Region(i, ir.Node("", "Softmax", [])) for i in values]
    found = repeats.find_repeats(
        [("attention", r) for r in regions], lambda r: LoweredRegion(("(same)",), 1, values[r.index]), facts
    )
    assert [r.index for r in found.representatives] == [0, 2]
    assert found.rename_of(regions[1]) == {values[0][0]: values[1][0], values[0][1]: values[1][1]}
    layer = Region(3, ir.Node("", "Sqrt", []))
    values[3] = values[0]
    other_kind = repeats.find_repeats(
        [("attention", regions[0]), ("layer", layer)], lambda r: LoweredRegion(("(same)",), 1, values[r.index]), facts
    )
    assert len(other_kind.representatives) == 2  # a norm is never a repeat of an attention region


def test_validation_reuses_a_small_models_session(monkeypatch):
    """Eight runs a validation (the original and the fused model on each feed set) build two sessions for a small
    model; a model over the size kept, or a run outside validation, builds one a run."""
    from egfuse.testing import Variant, attention_model, feeds_for
    from egfuse.validation import ahead, runner

    model = attention_model(Variant(heads=2))
    feeds = feeds_for(model)
    built = []
    real = runner.session
    monkeypatch.setattr(runner, "session", lambda *a, **k: built.append(1) or real(*a, **k))
    first = runner.run(model, feeds)
    runner.run(model, feeds)
    assert len(built) == 2
    with runner.kept_sessions():
        again = runner.run(model, feeds)
        runner.run(model, feeds)
        runner.run(model, feeds, [model.graph.output[0].name])
        assert len(built) == 4  # one more for the run asking another output list
        kept_bytes = runner.KEEP_BYTES
        monkeypatch.setattr(runner, "KEEP_BYTES", 0)
        runner.run(model, {**feeds})
        assert len(built) == 4  # kept before the size was lowered
        other = attention_model(Variant(heads=4))
        runner.run(other, feeds_for(other))
        runner.run(other, feeds_for(other))
        assert len(built) == 6
    monkeypatch.setattr(runner, "KEEP_BYTES", kept_bytes)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
    built.clear()
    result = egfuse.fuse(model, target="ort", validation=runner.Settings(ahead=False))
    assert result.report.fused == 1 and result.report.validated
    assert len(built) == 2, f"{len(built)} sessions for one validation of a small model"
    built.clear()  # the original run ahead (egfuse.validation.ahead): its session is the child's
    result = egfuse.fuse(model, target="ort")
    assert result.report.fused == 1 and result.report.validated
    assert len(built) == (1 if ahead.OriginalAhead.runs_here() else 2)
