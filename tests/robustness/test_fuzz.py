"""Fuzzed input never gets a traceback: hypothesis mutates a model's protobuf — bytes flipped, cut short,
garbage — and its graph — a node's input renamed, a node dropped or duplicated, dims and attributes changed,
data cut. Every run either fuses (and validates) or ends in one ``egfuse: error:`` line; the input is never
modified and nothing half-written is left beside it. ``experiments/robustness.py`` runs the same mutations at
scale and writes the figures."""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import egfuse
from egfuse.commands import cli
from egfuse.errors import EgfuseError
from egfuse.testing import Variant, attention_model
from egfuse.testing.mutate import GRAPH_MUTATIONS, mutate_bytes, mutate_graph

MODEL = attention_model(Variant(heads=2))
MODEL_BYTES = MODEL.SerializeToString()

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def run_cli(data: bytes) -> tuple[int, str, list[str], bytes]:
    """``egfuse optimize`` on ``data`` in a fresh folder: exit code, stderr, the folder's names, the input's
    bytes afterwards."""
    with tempfile.TemporaryDirectory() as folder:
        source, out = Path(folder) / "model.onnx", Path(folder) / "fused.onnx"
        source.write_bytes(data)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(["optimize", str(source), "-o", str(out), "-q"])
        names = sorted(p.name for p in Path(folder).iterdir())
        if out.exists():
            onnx.load(str(out))  # what was published is a whole model
        return code, err.getvalue(), names, source.read_bytes()


def assert_clean(code: int, err: str, names: list[str], after: bytes, before: bytes) -> None:
    assert "Traceback" not in err and "internal error" not in err, err
    assert after == before  # the input is never touched
    if code == 0:
        assert names == ["fused.onnx", "model.onnx"], names
    else:
        assert code == 1 and err.strip().startswith("egfuse: error: "), (code, err)
        assert len(err.strip().splitlines()) == 1, err
        assert names == ["model.onnx"], names


@FUZZ
@given(data=st.data())
def test_mutated_bytes_get_one_line(data):
    mutated = mutate_bytes(MODEL_BYTES, data.draw(st.randoms(use_true_random=False)))
    assert_clean(*run_cli(mutated), before=mutated)


@FUZZ
@given(garbage=st.binary(max_size=512))
def test_garbage_gets_one_line(garbage: bytes):
    assert_clean(*run_cli(garbage), before=garbage)


@FUZZ
@given(kind=st.sampled_from(sorted(GRAPH_MUTATIONS)), data=st.data())
def test_mutated_graphs_fuse_or_are_refused(kind: str, data):
    model = mutate_graph(MODEL, kind, data.draw(st.randoms(use_true_random=False)))
    before = model.SerializeToString()
    try:
        result = egfuse.fuse(model)
    except EgfuseError as err:
        assert "\n" not in str(err)
    else:
        assert result.report.validated is not False, str(result.report)
    assert model.SerializeToString() == before
