"""A folder of models fused at once (``egfuse optimize FOLDER -o OUT -j N``) and the fan-out under it: every
model fused and checked against its original on onnxruntime, one bad file or crashed job costing only
itself, and a second run resuming from the ledger."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import onnx
import pytest

from egfuse.commands import batch, fanout
from egfuse.commands.cli import main
from egfuse.testing import Variant, attention_model, disagreements, feeds_for

MODELS = {
    "bert.onnx": Variant(mask="padding_int"),
    "decoders/gqa.onnx": Variant(kv_heads=1, causal="trilu", k_layout="transpose_0132"),
}


@pytest.fixture
def zoo(tmp_path: Path) -> Path:
    folder = tmp_path / "zoo"
    for name, variant in MODELS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        onnx.save(attention_model(variant), folder / name)
    (folder / "broken.onnx").write_text("not a model")
    return folder


def test_a_folder_is_fused_model_by_model_and_each_keeps_its_meaning(zoo: Path, tmp_path: Path, capsys):
    out = tmp_path / "fused"
    code = main(["optimize", str(zoo), "-o", str(out), "-j", "2", "--target", "onnx"])
    printed = capsys.readouterr()
    assert code == 1  # the broken file failed; the others did not stop
    assert "broken.onnx: failed: file" in printed.out and "not a readable ONNX model" in printed.out
    for name in MODELS:
        fused = onnx.load(out / name)
        assert any(n.op_type == "Attention" for n in fused.graph.node)
        original = onnx.load(zoo / name)
        assert not disagreements(original, fused, feeds_for(original, seed=3, batch=2, seq=5, left_padding=True))
        report = json.loads((out / name).with_suffix(".report.json").read_text())
        assert report["validated"] is True
    ledger = json.loads((out / batch.LEDGER).read_text())["models"]
    assert {m: row["status"] for m, row in ledger.items()} == {
        "bert.onnx": "fused",
        "decoders/gqa.onnx": "fused",
        "broken.onnx": "failed",
    }
    assert not (out / "broken.onnx").exists()  # nothing half-written for the model that failed


def test_a_second_run_resumes_from_the_ledger(zoo: Path, tmp_path: Path):
    out, lines = tmp_path / "fused", []
    options = batch.Options(target="ort")
    batch.optimize_folder(zoo, out, options, echo=lines.append)
    assert lines[0].endswith("0 done before, fusing 3")
    lines.clear()
    batch.optimize_folder(zoo, out, options, echo=lines.append)
    assert lines[0].endswith("2 done before, fusing 1")  # only the broken file again
    changed = zoo / "bert.onnx"
    os.utime(changed, (changed.stat().st_atime, changed.stat().st_mtime + 10))
    (out / "decoders" / "gqa.onnx").unlink()
    lines.clear()
    batch.optimize_folder(zoo, out, options, echo=lines.append)
    assert lines[0].endswith("0 done before, fusing 3")  # an input changed, an output gone: both again
    lines.clear()
    batch.optimize_folder(zoo, out, batch.Options(target="onnx"), echo=lines.append)
    assert lines[0].endswith("0 done before, fusing 3")  # other options: everything again


def test_the_input_folder_is_never_the_output_folder(zoo: Path, capsys):
    assert main(["optimize", str(zoo), "-o", str(zoo / ".")]) == 1
    assert "would replace their originals" in capsys.readouterr().err


def test_an_output_folder_inside_the_input_is_not_read_as_input(zoo: Path):
    batch.optimize_folder(zoo, zoo / "fused", batch.Options(validate=False), echo=lambda line: None)
    assert [p.relative_to(zoo).as_posix() for p in batch.models_under(zoo, zoo / "fused")] == [
        "bert.onnx",
        "broken.onnx",
        "decoders/gqa.onnx",
    ]


def _square_or_die(x: int) -> int:
    if x == 3:
        os._exit(7)  # a crash in native code, as far as the pool can tell
    if x == 4:
        raise ValueError("four")
    return x * x


def test_a_job_that_kills_its_process_costs_only_itself():
    results = dict(fanout.fan_out(_square_or_die, [(i,) for i in range(6)], workers=2))
    assert {i: results[i] for i in (0, 1, 2, 5)} == {0: 0, 1: 1, 2: 4, 5: 25}
    assert isinstance(results[3], fanout.Crashed)
    assert isinstance(results[4], ValueError)


def test_flags_for_a_folder_on_one_model_are_a_usage_error(zoo: Path, tmp_path: Path, capsys):
    assert main(["optimize", str(zoo / "bert.onnx"), "-o", str(tmp_path / "x.onnx"), "-j", "2"]) == 2
    assert "this input is one model" in capsys.readouterr().err
    assert main(["optimize", str(zoo), "-o", str(tmp_path / "o"), "--report", str(tmp_path / "r.json")]) == 2
    assert "--report is for one model" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists() and not (tmp_path / "o").exists()


class _FakeRay(types.ModuleType):
    """Ray's API as fan_out uses it (init, remote, wait, get), run in this process: the contract, not Ray."""

    def __init__(self) -> None:
        super().__init__("ray")
        self.address = None

    def init(self, address: str, **_: object) -> None:
        self.address = address

    def remote(self, function):
        return types.SimpleNamespace(remote=lambda *args: ("ref", function(*args)))

    def wait(self, refs: list, num_returns: int):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref: tuple):
        return ref[1]


def test_jobs_go_to_a_ray_cluster_when_given_its_address(monkeypatch):
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    results = dict(fanout.fan_out(_square_or_die, [(1,), (2,), (4,)], ray_address="ray://head:10001"))
    assert fake.address == "ray://head:10001"
    assert results[0] == 1 and results[1] == 4 and isinstance(results[2], ValueError)


def test_without_ray_installed_the_error_says_how_to_get_it(monkeypatch, zoo: Path, tmp_path: Path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert main(["optimize", str(zoo), "-o", str(tmp_path / "o"), "--ray", "auto"]) == 1
    assert "pip install 'egfuse[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # said before anything was made


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="Ray is an optional extra: pip install 'egfuse[ray]'"
)
def test_a_folder_fused_on_a_local_ray_cluster(zoo: Path, tmp_path: Path):
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        outcomes = batch.optimize_folder(
            zoo, tmp_path / "fused", batch.Options(target="ort"), ray_address="auto", echo=lambda line: None
        )
    finally:
        ray.shutdown()
    assert sorted(o.status for o in outcomes) == ["failed", "fused", "fused"]
    original, fused = onnx.load(zoo / "bert.onnx"), onnx.load(tmp_path / "fused" / "bert.onnx")
    assert not disagreements(original, fused, feeds_for(original, seed=3))
