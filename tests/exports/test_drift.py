"""Exporter drift: the same tiny architectures exported by (transformers, torch) stacks from three years of
releases (`experiments/drift_corpus.py`, committed under tests/data/drift/<stack>/). Every attention block of
every export fuses on both targets, validated by egfuse's own generated inputs (as `experiments/compare.py`
measures coverage), and the result matches the original on the inputs the export was made with.

Each export runs on one target, alternating; the fast suite runs one in sixty (most stacks, both
exporters and targets among them), the slow suite (`-m slow`, which CI runs) the rest. An export onnxruntime
itself cannot run (an exporter bug: Falcon's complex128 rotary tables in TorchScript) must come back unchanged:
nothing can be proven on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.preparation import functions
from egfuse.validation import judge, validate

from ..conftest import DATA, assert_same_outputs, fused_op_count

DRIFT = DATA / "drift"
STACKS = sorted(p.parent for p in DRIFT.glob("*/manifest.json"))

KNOWN_GAPS: dict[tuple[str, str, str], str] = {}
"""(stack, file, target) → why it does not fuse yet: run as strict xfail, so a gap that closes fails until it is
removed here."""

KNOWN_EXPORTER_GAPS: dict[tuple[str, str], str] = {}
"""(stack, exporter) → why some of its exports do not fuse yet: a non-strict xfail. Empty since torch 2.2/2.4's
dynamo exports (model-local functions whose inlining broke: mistyped hints, folded torchlib literals, split
sequences) fuse — issue 34 item 6."""


def _entries() -> list[tuple[Path, dict]]:
    return [
        (stack, entry)
        for stack in STACKS
        for entry in json.loads((stack / "manifest.json").read_text())["models"]
        if entry["file"] and not entry["error"]
    ]


def _cases() -> list:
    """Each export once, the targets alternating (both targets' coverage of every export is measured by
    experiments/drift_coverage.py); one case in 120 in the fast suite (thirteen stacks of a hundred exports),
    the rest slow."""
    cases = []
    for i, (stack, entry) in enumerate(_entries()):
        target = ("ort", "onnx")[i % 2]
        marks = [] if i % 120 == 0 else [pytest.mark.slow]
        gap = KNOWN_GAPS.get((stack.name, entry["file"], target))
        if gap:
            marks.append(pytest.mark.xfail(reason=gap, strict=True))
        exporter_gap = KNOWN_EXPORTER_GAPS.get((stack.name, entry["exporter"]))
        if exporter_gap:
            marks.append(pytest.mark.xfail(reason=exporter_gap, strict=False))
        cases.append(pytest.param(stack, entry, target, marks=marks, id=f"{stack.name}-{target}-{entry['file']}"))
    return cases


def test_the_corpus_spans_three_years_of_releases():
    """At least five stacks, the oldest from 2023, and at least 15 architectures each exported somewhere."""
    assert len(STACKS) >= 5, [s.name for s in STACKS]
    assert STACKS[0].name <= "2023-12" and STACKS[-1].name >= "2026-01", [s.name for s in STACKS]
    architectures = {entry["name"].split("_eager")[0].split("_sdpa")[0] for _, entry in _entries()}
    assert len(architectures) >= 15, sorted(architectures)
    for stack in STACKS:
        manifest = json.loads((stack / "manifest.json").read_text())
        assert manifest["transformers"] and manifest["torch"], stack.name


@pytest.mark.parametrize(("stack", "entry", "target"), _cases())
def test_every_block_fuses_and_matches(stack: Path, entry: dict, target: str):
    path = stack / entry["file"]
    feeds = dict(np.load(path.with_name(path.name.replace(".onnx", ".feeds.npz"))))
    original = onnx.load(path)
    try:
        validate.run(original, feeds)
    except Exception:  # the export itself does not run: nothing may be applied, unless its inlined graph runs
        result = egfuse.fuse(path, target=target)
        if result.report.fused == 0:
            assert result.report.validated is not True, str(result.report)
            return
        if judge.FLOAT32_COPIES_NOTE in result.report.notes:  # bfloat16 ops the CPU has no kernel for (Falcon)
            assert result.report.validated is True, str(result.report)
            inlined = functions.inline(original).proto  # the functions' own bfloat16 ops widened too
            wide = validate.upcast_feeds(feeds, fills=True)
            assert_same_outputs(validate.upcast(inlined, fills=True), validate.upcast(result.model, fills=True), wide)
            return
        # torch 2.4's functions list an output twice, which onnxruntime refuses; inlined, the graph runs: the
        # fused model is proven against it, and the report says the model as given does not load
        assert any("does not load the model as given" in note for note in result.report.notes), str(result.report)
        assert result.report.validated is True, str(result.report)
        assert_same_outputs(functions.inline(original).proto, result.model, feeds)
        return
    result = egfuse.fuse(path, target=target)
    report = result.report
    assert report.fused == entry["blocks"], str(report)
    assert report.validated is True, str(report)
    assert fused_op_count(result.model, target) == entry["blocks"], str(report)
    assert_same_outputs(original, result.model, feeds)
