"""The command line, as a user meets it: the demo, optimize, and one-line errors with no partial output."""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
import pytest

from egfuse.testing import Variant, attention_model, feeds_for

from ..conftest import assert_same_outputs


def egfuse_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "egfuse", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_demo():
    proc = egfuse_cli("demo")
    assert proc.returncode == 0, proc.stderr
    assert "attention fused: 2/2" in proc.stdout
    assert "validation: passed" in proc.stdout


def test_optimize_writes_model_and_report(tmp_path):
    model = attention_model(Variant())
    src, out, rep = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(model, src)
    proc = egfuse_cli("optimize", str(src), "-o", str(out), "--target", "onnx", "--report", str(rep))
    assert proc.returncode == 0, proc.stderr
    assert "attention fused: 1/1" in proc.stdout
    assert json.loads(rep.read_text())["fused"] == 1
    assert_same_outputs(model, onnx.load(out), feeds_for(model))


@pytest.mark.parametrize("case", ["missing", "not_onnx", "truncated", "opset", "directory", "same_path"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, case):
    src = tmp_path / "in.onnx"
    data = attention_model(Variant()).SerializeToString()
    if case == "not_onnx":
        src.write_text("this is not a model\n" * 20)
    elif case == "truncated":
        src.write_bytes(data[: len(data) // 2])
    elif case == "opset":
        model = attention_model(Variant())
        model.opset_import[0].version = 99
        src.write_bytes(model.SerializeToString())
    elif case == "directory":
        src.mkdir()
    elif case in ("same_path",):
        src.write_bytes(data)
    out = src if case == "same_path" else tmp_path / "out.onnx"
    before = out.read_bytes() if out.is_file() else None
    proc = egfuse_cli("optimize", str(src), "-o", str(out))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("egfuse: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert str(src) in lines[0] or str(out) in lines[0]
    if case == "same_path":
        assert out.read_bytes() == before
    else:
        assert not out.exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_feeds_from_npz_are_used_for_validation(tmp_path):
    import numpy as np

    model = attention_model(Variant(mask="padding_int"))
    src, out, feeds = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "feeds.npz"
    onnx.save(model, src)
    np.savez(feeds, **feeds_for(model, seed=3, batch=3, seq=6))
    proc = egfuse_cli("optimize", str(src), "-o", str(out), "--feeds", str(feeds))
    assert proc.returncode == 0, proc.stderr
    assert "validation: passed" in proc.stdout
    assert_same_outputs(model, onnx.load(out), feeds_for(model, seed=3, batch=3, seq=6))


def test_missing_feeds_file_is_a_one_line_error(tmp_path):
    src = tmp_path / "in.onnx"
    onnx.save(attention_model(Variant()), src)
    proc = egfuse_cli("optimize", str(src), "-o", str(tmp_path / "out.onnx"), "--feeds", str(tmp_path / "no.npz"))
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("egfuse: error: file ") and "no such file" in proc.stderr
    assert not (tmp_path / "out.onnx").exists()
