"""The original's side of validation run ahead, in a child forked while the search goes on
(:mod:`egfuse.validation.ahead`): the same reports and fused models as without it, injected faults still caught, the
judge running the original itself wherever the child fails or is stuck, and no child left behind."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.testing import attention_model
from egfuse.validation import ahead, runner, validate

from ..conftest import DATA

_PATH = Path(__file__).resolve().parents[2] / "experiments" / "validation_mutations.py"
_spec = importlib.util.spec_from_file_location("validation_mutations_ahead", _PATH)
mutations = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutations)

MODEL = DATA / "bert_sdpa.dynamo.onnx"  # padding masks: the mask-exercising feed sets are run ahead too

pytestmark = pytest.mark.skipif(
    not ahead.OriginalAhead.runs_here(),
    reason="the original is run ahead only on Linux with a second CPU (and not with EGFUSE_RUN_AHEAD=0); elsewhere "
    "the judge runs it as before",
)


def _fuse(model, on: bool) -> egfuse.FuseResult:
    return egfuse.fuse(model, target="ort", validation=validate.Settings(ahead=on))


def _report(result: egfuse.FuseResult) -> dict:
    report = result.report.to_dict()
    report.pop("stats")  # times
    return report


class _Spy:
    """Counts the parent's sessions and the runs it read from the child instead."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sessions = self.served = 0
        session, outputs = runner.session, runner.Precomputed.outputs

        def counted_session(*args, **kwargs):
            self.sessions += 1
            return session(*args, **kwargs)

        def counted_outputs(precomputed, *args, **kwargs):
            found = outputs(precomputed, *args, **kwargs)
            self.served += found is not None
            return found

        monkeypatch.setattr(runner, "session", counted_session)
        monkeypatch.setattr(runner.Precomputed, "outputs", counted_outputs)


def test_the_same_report_and_model_with_the_original_run_ahead(monkeypatch: pytest.MonkeyPatch):
    """Every run of the original the judge makes on generated feeds — the first set and each mask-exercising
    one — is read from the child, and only the fused model gets a session in this process; the report (times
    aside) and the written model are those of a run without it."""
    model = onnx.load(MODEL)
    alone = _fuse(model, on=False)
    spy = _Spy(monkeypatch)
    early = _fuse(model, on=True)
    assert early.report.validated is True and early.report.fused >= 2, str(early.report)
    assert _report(early) == _report(alone)
    assert early.model.SerializeToString() == alone.model.SerializeToString()
    mask_sets = len(validate.mask_feed_sets(validate.make_feeds(model)))
    assert mask_sets >= 3
    assert spy.served >= 1 + mask_sets
    assert spy.sessions == 1  # the fused model's; the original's was the child's


def test_a_child_that_fails_leaves_the_judge_to_run_the_original(monkeypatch: pytest.MonkeyPatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the child's runs fail")

    model = onnx.load(MODEL)
    alone = _fuse(model, on=False)
    monkeypatch.setattr(ahead, "_original_runs", broken)  # what the forked child will call
    spy = _Spy(monkeypatch)
    early = _fuse(model, on=True)
    assert spy.served == 0 and spy.sessions == 2
    assert _report(early) == _report(alone)


def test_a_stuck_child_is_killed_and_the_judge_runs_the_original(monkeypatch: pytest.MonkeyPatch):
    children: list[int] = []
    start = ahead.OriginalAhead.start

    def recorded(self, names):
        start(self, names)
        if self.pid is not None:
            children.append(self.pid)

    monkeypatch.setattr(ahead, "_original_runs", lambda *args: time.sleep(600))
    monkeypatch.setattr(ahead, "WAIT_SECONDS", 0.2)
    monkeypatch.setattr(ahead.OriginalAhead, "start", recorded)
    result = _fuse(onnx.load(MODEL), on=True)
    assert result.report.validated is True, str(result.report)
    assert children
    for pid in children:
        with pytest.raises(ChildProcessError):  # reaped: no such child any more
            os.waitpid(pid, os.WNOHANG)


def test_closing_stops_a_running_child_and_removes_its_file(monkeypatch: pytest.MonkeyPatch):
    """The search failing, or finding nothing to fuse, leaves no child and no file behind."""
    monkeypatch.setattr(ahead, "_original_runs", lambda *args: time.sleep(600))
    early = ahead.OriginalAhead(onnx.load(MODEL), None, None, enabled=True)
    early.start(["nothing"])
    pid, path = early.pid, early.path
    assert pid is not None and Path(path).exists()
    early.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    assert not Path(path).exists()
    early.start(["again"])  # once closed, never started again
    assert early.pid is None and early.precomputed() is None


def test_injected_faults_are_caught_with_the_original_read_from_the_child(monkeypatch: pytest.MonkeyPatch):
    """The child's outputs stand in for the original only: the fused model is run each time, so every fault the
    judge catches it still catches (validation_mutations' faults, on a padded encoder)."""
    original = attention_model(mutations.BASES["encoder, padding"])
    result = egfuse.fuse(original, target="ort")
    assert result.report.validated is True and result.report.fused == 1, str(result.report)
    names = [entry.output for entry in result.report.entries() if entry.output]
    early = ahead.OriginalAhead(original, None, None, enabled=True)
    early.start(names)
    precomputed = early.precomputed()
    assert precomputed is not None and precomputed.more
    spy = _Spy(monkeypatch)
    tried = 0
    with runner.precomputed(precomputed):
        for kind, fault in mutations.FAULTS.items():
            if kind == "fully masked rows changed":
                continue  # seen only under a causal mask (this base has none)
            outcome = mutations.trial(original, result, fault)
            if outcome is None:
                continue
            tried += 1
            assert outcome["caught"], kind
    assert tried >= 15 and spy.served >= tried


def test_precomputed_outputs_are_read_only_for_the_same_model_feeds_and_names():
    model = onnx.load(MODEL)
    data = validate.make_feeds(model)
    value = next(out for node in model.graph.node if node.op_type == "Softmax" for out in node.output)
    expected = runner.run(model, data, [value])
    early = runner.Precomputed(model, None, data, expected, [])
    graph = [o.name for o in model.graph.output]
    assert list(early.outputs(model, dict(data), [value])) == [*graph, value]
    assert list(early.outputs(model, data, [])) == graph
    assert early.outputs(model, data, [value, "another"]) is None  # a name the child did not run
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assert early.outputs(copy, data, [value]) is None  # another model, however equal
    changed = {name: array.copy() for name, array in data.items()}
    first = next(iter(changed))
    changed[first].flat[0] += 1
    assert early.outputs(model, changed, [value]) is None


@pytest.mark.parametrize(
    ("settings", "weights", "validating"),
    [
        (validate.Settings(ahead=False), None, True),
        (validate.Settings(providers=("CUDAExecutionProvider",)), None, True),
        (validate.DEFAULTS, object(), True),  # weights in files: a second session would map them again
        (validate.DEFAULTS, None, False),
    ],
    ids=["switched off", "another provider", "weights in files", "not validating"],
)
def test_not_run_ahead_where_it_should_not(settings, weights, validating):
    model = onnx.load(MODEL)
    with validate.using(settings), ahead.ahead(model, None, None, validate=validating, weights=weights) as early:
        early.start(["x"])
        assert not early.enabled and early.pid is None
    with ahead.ahead(model, None, None, validate=True, weights=None) as early:
        assert early.enabled


def test_a_large_model_is_not_run_ahead(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(ahead, "MAX_MODEL_BYTES", 0)
    with ahead.ahead(onnx.load(MODEL), None, None, validate=True, weights=None) as early:
        assert not early.enabled


def test_the_child_computes_what_the_parent_would():
    """The forked child's feeds and outputs are, array for array, those of the same calls made here."""
    model = onnx.load(MODEL)
    kinds = ("Softmax", "LayerNormalization")
    names = [out for node in model.graph.node if node.op_type in kinds for out in node.output]
    early = ahead.OriginalAhead(model, None, None, enabled=True)
    early.start(names)
    child = early.precomputed()
    here = ahead._original_runs(model, None, names, None)
    assert child is not None and sys.platform == "linux"
    assert len(child.more) == len(here[2]) >= 3
    for (feeds_a, outputs_a), (feeds_b, outputs_b) in zip(
        [(child.data, child.expected), *child.more], [(here[0], here[1]), *here[2]], strict=True
    ):
        assert feeds_a.keys() == feeds_b.keys() and outputs_a.keys() == outputs_b.keys()
        assert all(np.array_equal(feeds_a[n], feeds_b[n]) for n in feeds_a)
        assert all(np.array_equal(outputs_a[n], outputs_b[n], equal_nan=True) for n in outputs_a)


def test_a_child_reaped_elsewhere_is_a_failed_one(monkeypatch: pytest.MonkeyPatch):
    """A host that ignores SIGCHLD has its children reaped by the kernel: waiting for one raises, and the judge
    runs the original itself instead of the fusion failing."""
    model = onnx.load(MODEL)
    alone = _fuse(model, on=False)

    def reaped(pid: int, seconds: float) -> int:
        os.waitpid(pid, 0)  # someone else reaps it first
        return os.waitpid(pid, 0)[1]  # raises ChildProcessError

    monkeypatch.setattr(ahead, "_wait", reaped)
    spy = _Spy(monkeypatch)
    early = _fuse(model, on=True)
    assert spy.served == 0 and spy.sessions == 2
    assert _report(early) == _report(alone)
