"""The command line's switches behave like the tools users know: --version, quiet runs, RoPE and opset switches,
validation tolerances, providers and memory budget passed through, a status line only on a terminal, and a
fused model that says what wrote it."""

from __future__ import annotations

import io
import time
from pathlib import Path

import onnx
import pytest

import egfuse
import egfuse.testing
from egfuse import progress
from egfuse.commands import cli
from egfuse.validation.validate import Settings, make_feeds
from egfuse.version import __version__

from ..conftest import assert_same_outputs

LLAMA = Path(__file__).parents[1] / "data" / "llama_sdpa.dynamo.onnx"


def _needs(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path.name} is not in this checkout")


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"egfuse {__version__}"


def test_quiet_demo_prints_nothing(capsys):
    assert cli.main(["demo", "-q"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_no_rope_leaves_rotations_and_keep_opset_keeps_the_opset(tmp_path, capsys):
    _needs(LLAMA)
    out = tmp_path / "out.onnx"
    assert cli.main(["optimize", str(LLAMA), "-o", str(out), "--no-rope", "--keep-opset"]) == 0
    text = capsys.readouterr().out
    assert "rotary embeddings fused: 0/4" in text and "--no-rope" in text
    fused, original = onnx.load(out), onnx.load(LLAMA)
    opset = {e.domain: e.version for e in fused.opset_import}
    assert opset[""] == {e.domain: e.version for e in original.opset_import}[""] < 23
    assert not any(n.op_type == "RotaryEmbedding" for n in fused.graph.node)
    assert fused.producer_name == "egfuse" and fused.producer_version == __version__
    assert any(p.key == "egfuse.source_producer" and "pytorch" in p.value for p in fused.metadata_props)


def test_keep_opset_refuses_a_target_that_needs_opset_23(tmp_path, capsys):
    _needs(LLAMA)
    out = tmp_path / "out.onnx"
    assert cli.main(["optimize", str(LLAMA), "-o", str(out), "--target", "onnx", "--keep-opset"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--keep-opset" in err[0] and not out.exists()


def test_validation_switches_reach_fuse(tmp_path, monkeypatch):
    seen = {}

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return egfuse.fuse(*args, **kwargs)

    monkeypatch.setattr(cli, "fuse", spy)
    src = tmp_path / "in.onnx"
    onnx.save(egfuse.testing.attention_model(egfuse.testing.Variant()), src)
    argv = ["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "-q", "--atol", "2e-4", "--rtol", "0.01"]
    assert cli.main([*argv, "--provider", "CPUExecutionProvider", "--memory-budget", "0.5"]) == 0
    assert seen["validation"] == Settings(2e-4, 0.01, ("CPUExecutionProvider",))
    assert seen["budgets"].validation_bytes == 2**29


def test_tolerances_decide():
    """Zero tolerance on a model whose fused op rounds differently: the differing region is rolled back."""
    _needs(LLAMA)
    exact = egfuse.fuse(LLAMA, validation=Settings(atol=0.0, rtol=0.0))
    default = egfuse.fuse(LLAMA)
    assert default.report.fused == 2 and exact.report.fused < 2
    model = onnx.load(LLAMA)
    assert_same_outputs(model, exact.model, make_feeds(model))


def test_status_line_only_where_enabled():
    shown = io.StringIO()
    with progress.status_line(True, shown, every=0.01):
        progress.stage("validating 3 fused regions")
        time.sleep(0.05)
    assert "egfuse: validating 3 fused regions" in shown.getvalue() and shown.getvalue().endswith("\r")
    silent = io.StringIO()
    with progress.status_line(False, silent):
        progress.stage("anything")
    assert silent.getvalue() == ""
