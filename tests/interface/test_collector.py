"""The cycle collector's pace during a fusion: raised while it runs, the caller's own put back afterwards —
also when the fusion fails, and never lowered below what the caller chose."""

from __future__ import annotations

import gc

import pytest

import egfuse
import egfuse.api
from egfuse.collector import FUSION_THRESHOLDS, paced_for_fusion
from egfuse.errors import EgfuseError
from egfuse.testing import Variant, attention_model


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_a_fusion_runs_paced_and_puts_the_callers_pace_back(thresholds, monkeypatch):
    seen = []
    inner = egfuse.api.fuse_loaded

    def spy(*args, **kwargs):
        seen.append(gc.get_threshold())
        return inner(*args, **kwargs)

    monkeypatch.setattr(egfuse.api, "fuse_loaded", spy)
    result = egfuse.fuse(attention_model(Variant()), target="ort")
    assert result.report.fused == 1
    assert seen == [FUSION_THRESHOLDS]
    assert gc.get_threshold() == (700, 10, 10)


def test_a_failing_fusion_puts_the_callers_pace_back(thresholds, tmp_path):
    with pytest.raises(EgfuseError):
        egfuse.fuse(str(tmp_path / "missing.onnx"))
    assert gc.get_threshold() == (700, 10, 10)


def test_nested_fusions_restore_once_and_slower_paces_are_kept(thresholds):
    gc.set_threshold(100_000, 10, 10)
    with paced_for_fusion():
        with paced_for_fusion():
            assert gc.get_threshold() == (100_000, FUSION_THRESHOLDS[1], FUSION_THRESHOLDS[2])
        assert gc.get_threshold() == (100_000, FUSION_THRESHOLDS[1], FUSION_THRESHOLDS[2])
    assert gc.get_threshold() == (100_000, 10, 10)
