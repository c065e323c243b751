"""Files are sacred: no output lands on an input or another output, on something that is not a plain file, or
half-written; external weights are read only from the model's folder, and only when their sizes are right."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import egfuse
from egfuse.commands.cli import main
from egfuse.errors import EgfuseError, ExternalDataError, UnsafeOutputError
from egfuse.files import save
from egfuse.files.outputs import check_outputs
from egfuse.testing import Variant, attention_model, feeds_for

from ..conftest import assert_same_outputs

MODEL = attention_model(Variant())


# ---------------------------------------------------------------------------------------------------- helpers


def optimize(capsys, *args: object) -> tuple[int, str, str]:
    """``egfuse optimize ARGS`` in this process: (exit code, stdout, stderr)."""
    code = main(["optimize", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *words: str) -> None:
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("egfuse: error: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], lines[0]


def snapshot(folder: Path) -> dict[str, object]:
    """Every entry under ``folder`` (hidden ones too): a file's bytes, a link's target, other kinds by mode."""
    entries: dict[str, object] = {}
    for path in sorted(folder.rglob("*")):
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            entries[str(path)] = ("link", os.readlink(path))
        elif stat.S_ISREG(mode):
            entries[str(path)] = path.read_bytes()
        else:
            entries[str(path)] = stat.S_IFMT(mode)
    return entries


def plain_model(folder: Path, name: str = "in.onnx") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(MODEL, folder / name)
    return folder / name


def external_model(folder: Path, location: str = "weights.bin", model: onnx.ModelProto = MODEL) -> Path:
    """``model`` saved at ``folder``/in.onnx with every tensor in ``location`` beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx.save moves what it writes out of the proto it is given
    path = folder / "in.onnx"
    onnx.save(copy, path, save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=0)
    return path


def edit_references(path: Path, **changes: str) -> None:
    """Set ``changes`` (location=…, length=…) in the external-data entries of the model at ``path``'s first
    initializer (location: of all of them)."""
    proto = onnx.load(path, load_external_data=False)
    for i, tensor in enumerate(proto.graph.initializer):
        for entry in tensor.external_data:
            if entry.key in changes and (entry.key == "location" or i == 0):
                entry.value = changes[entry.key]
    onnx.save(proto, path)


def references(path: Path) -> set[str]:
    raw = onnx.load(path, load_external_data=False)
    return {e.value for t in raw.graph.initializer for e in t.external_data if e.key == "location"}


@pytest.fixture(scope="module")
def fused() -> egfuse.FuseResult:
    return egfuse.fuse(MODEL, validate=False)


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder nobody can write into — as root too (``chattr +i``), or the test is skipped."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    immutable = False
    if os.access(folder, os.W_OK):  # root ignores modes
        immutable = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
        if not immutable:
            pytest.skip("cannot make a folder read-only for this user")
    yield folder
    if immutable:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    folder.chmod(0o755)


# ------------------------------------------------------------------ outputs that are inputs or other outputs


def test_report_equal_to_input_is_refused(tmp_path, capsys):
    src = plain_model(tmp_path)
    before = snapshot(tmp_path)
    code, _, err = optimize(capsys, src, "-o", tmp_path / "out.onnx", "--report", src)
    assert_one_line_error(code, err, str(src), "the input model")
    assert snapshot(tmp_path) == before


def test_report_equal_to_output_is_refused(tmp_path, capsys):
    src, out = plain_model(tmp_path), tmp_path / "out.onnx"
    before = snapshot(tmp_path)
    code, _, err = optimize(capsys, src, "-o", out, "--report", out)
    assert_one_line_error(code, err, str(out), "the report (--report) here: it is also where the fused model (-o) goes")
    assert snapshot(tmp_path) == before


def test_report_on_the_outputs_weights_file_is_refused(tmp_path, capsys):
    src, out = external_model(tmp_path / "m"), tmp_path / "out.onnx"
    code, _, err = optimize(capsys, src, "-o", out, "--report", tmp_path / "out.onnx.data")
    assert_one_line_error(code, err, "out.onnx.data", "weights")
    assert not out.exists()


@pytest.mark.parametrize("case", ["missing", "read_only"])
def test_report_in_a_folder_that_cannot_take_it_writes_nothing(tmp_path, capsys, request, case):
    src, out = plain_model(tmp_path), tmp_path / "out.onnx"
    folder = tmp_path / "no-such-folder" if case == "missing" else request.getfixturevalue("read_only_folder")
    code, _, err = optimize(capsys, src, "-o", out, "--report", folder / "r.json")
    assert_one_line_error(code, err, str(folder), "does not exist" if case == "missing" else "not writable")
    assert not out.exists()  # refused before the run: the model is not written either
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_output_in_a_read_only_folder_is_refused(tmp_path, capsys, read_only_folder):
    src = plain_model(tmp_path)
    code, _, err = optimize(capsys, src, "-o", read_only_folder / "out.onnx")
    assert_one_line_error(code, err, "not writable")


@pytest.mark.parametrize("case", ["weights_file", "hard_link"])
def test_output_that_is_an_input_file_is_refused(tmp_path, capsys, case):
    src = external_model(tmp_path / "m")
    out = src.parent / "weights.bin"
    if case == "hard_link":
        out = tmp_path / "link.onnx"
        os.link(src, out)
    before = snapshot(tmp_path)
    code, _, err = optimize(capsys, src, "-o", out)
    assert_one_line_error(code, err, str(out), "the input")
    assert snapshot(tmp_path) == before


def test_inputs_weights_named_like_the_outputs_are_left_alone(tmp_path, capsys):
    """The input keeps its weights in ``out.onnx.data``: ``-o out.onnx`` must not write its own weights there."""
    src = external_model(tmp_path, location="out.onnx.data")
    weights = (tmp_path / "out.onnx.data").read_bytes()
    out = tmp_path / "out.onnx"
    code, _, err = optimize(capsys, src, "-o", out, "-q")
    assert code == 0, err
    assert (tmp_path / "out.onnx.data").read_bytes() == weights
    (written,) = references(out)
    assert written != "out.onnx.data" and (tmp_path / written).is_file()
    assert_same_outputs(MODEL, onnx.load(out), feeds_for(MODEL))
    assert_same_outputs(MODEL, onnx.load(src), feeds_for(MODEL))  # the input still loads, weights and all
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_api_save_refuses_the_inputs_files(tmp_path):
    src = external_model(tmp_path)
    result = egfuse.fuse(src)
    before = snapshot(tmp_path)
    for path in (src, tmp_path / "weights.bin"):
        with pytest.raises(UnsafeOutputError, match="the input"):
            result.save(path)
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------------------ outputs that are not files


def _target(tmp_path: Path, case: str) -> Path:
    if case == "fifo":
        os.mkfifo(tmp_path / "fifo")
        return tmp_path / "fifo"
    if case == "symlink":
        (tmp_path / "real.onnx").write_bytes(b"keep me")
        (tmp_path / "link.onnx").symlink_to(tmp_path / "real.onnx")
        return tmp_path / "link.onnx"
    if case == "device":  # a /dev/null of our own: the real one is not for a test to risk
        try:
            os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("creating a device node needs root")
        return tmp_path / "null"
    if case == "directory":
        (tmp_path / "dir.onnx").mkdir()
        return tmp_path / "dir.onnx"
    if case == "under_file":
        (tmp_path / "file.txt").write_text("a file")
        return tmp_path / "file.txt" / "out.onnx"
    if case == "too_long":
        return tmp_path / ("x" * 300 + ".onnx")
    assert case == "empty"
    return Path("")


@pytest.mark.parametrize("case", ["fifo", "symlink", "device", "directory", "under_file", "too_long", "empty"])
def test_output_that_is_not_a_file_is_a_one_line_error(tmp_path, capsys, monkeypatch, case):
    src = plain_model(tmp_path / "src")
    monkeypatch.chdir(tmp_path)
    out = _target(tmp_path, case)
    before = snapshot(tmp_path)
    code, _, err = optimize(capsys, src, "-o", out)
    assert_one_line_error(code, err, "refusing to write the fused model (-o) here")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("case", ["fifo", "symlink", "device", "directory", "under_file", "too_long", "empty"])
def test_api_save_to_what_is_not_a_file_is_refused(tmp_path, monkeypatch, fused, case):
    monkeypatch.chdir(tmp_path)
    out = _target(tmp_path, case)
    before = snapshot(tmp_path)
    with pytest.raises(UnsafeOutputError, match="refusing to write the model here"):
        fused.save(out)
    assert snapshot(tmp_path) == before


def test_dev_null_is_refused_without_writing():
    """Checked only: were the check wrong, a save would replace the machine's /dev/null."""
    with pytest.raises(UnsafeOutputError, match="a device"):
        check_outputs({"the fused model (-o)": Path("/dev/null")})


def test_a_250_character_name_is_written(tmp_path, capsys):
    src, out = plain_model(tmp_path / "src"), tmp_path / ("x" * 245 + ".onnx")
    code, _, err = optimize(capsys, src, "-o", out, "-q")
    assert code == 0, err
    assert_same_outputs(MODEL, onnx.load(out), feeds_for(MODEL))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["src", out.name])


# ------------------------------------------------------------------------------------ external-data locations


def _bad_location(tmp_path: Path, case: str) -> Path:
    src = external_model(tmp_path / "m")
    weights = src.parent / "weights.bin"
    if case == "dotdot":
        weights.rename(tmp_path / "weights.bin")
        edit_references(src, location="../weights.bin")
    elif case == "absolute":
        weights.rename(tmp_path / "weights.bin")
        edit_references(src, location=str(tmp_path / "weights.bin"))
    elif case == "symlink_out":
        weights.rename(tmp_path / "outside.bin")
        weights.symlink_to(tmp_path / "outside.bin")
    elif case == "wrong_size":
        edit_references(src, length="1000")  # the first initializer is 16×16 float32: 1024 bytes
    elif case == "past_the_end":
        edit_references(src, length="1024", offset=str(weights.stat().st_size - 10))
    else:
        assert case == "missing"
        weights.unlink()
    return src


LOCATION_CASES = {
    "dotdot": "leaves the model's folder",
    "absolute": "absolute path",
    "symlink_out": "outside the model's folder",
    "wrong_size": "1000 bytes, but a FLOAT tensor of shape [16, 16] has 1024",
    "past_the_end": "past the end of the file",
    "missing": "does not exist",
}


@pytest.mark.parametrize("case", list(LOCATION_CASES))
def test_untrusted_external_data_is_a_one_line_error(tmp_path, capsys, case):
    src = _bad_location(tmp_path, case)
    out = tmp_path / "out.onnx"
    code, _, err = optimize(capsys, src, "-o", out)
    assert_one_line_error(code, err, str(src), LOCATION_CASES[case])
    assert not out.exists()
    with pytest.raises(ExternalDataError, match=r"weights|tensor"):
        egfuse.fuse(src)


def test_weights_through_a_link_inside_the_folder_are_read(tmp_path):
    src = external_model(tmp_path)
    (tmp_path / "weights.bin").rename(tmp_path / "real.bin")
    (tmp_path / "weights.bin").symlink_to("real.bin")
    assert egfuse.fuse(src).report.fused == 1


def test_in_memory_model_with_unloaded_weights_is_refused(tmp_path, monkeypatch):
    """Nothing says which folder such weights are in: the current one (here holding a wrong weights.bin of
    the right size) must not be read."""
    src = external_model(tmp_path / "m")
    proto = onnx.load(src, load_external_data=False)
    (tmp_path / "weights.bin").write_bytes(bytes((src.parent / "weights.bin").stat().st_size))
    monkeypatch.chdir(tmp_path)
    for model in (proto, ir.serde.deserialize_model(proto)):
        with pytest.raises(ExternalDataError, match="not loaded"):
            egfuse.fuse(model)
    monkeypatch.chdir(src.parent)
    with pytest.raises(ExternalDataError, match="not loaded"):
        egfuse.fuse(ir.load("in.onnx"))  # a bare name: onnx-ir records no folder, as for the one above


def test_onnx_ir_model_reads_weights_from_its_own_folder(tmp_path, monkeypatch):
    src = external_model(tmp_path / "m")
    (tmp_path / "weights.bin").write_bytes(bytes((src.parent / "weights.bin").stat().st_size))
    monkeypatch.chdir(tmp_path)
    result = egfuse.fuse(ir.load(src.resolve()))
    assert result.report.fused == 1
    assert_same_outputs(MODEL, result.model, feeds_for(MODEL))


# ----------------------------------------------------------------------------------------- saving weights


def test_api_save_with_external_data_writes_the_weights_file(tmp_path):
    tiny = attention_model(Variant(heads=1, head_dim=4))  # every tensor under onnx-ir's 256-byte threshold
    for name, model in (("a.onnx", MODEL), ("b.onnx", tiny)):
        out = tmp_path / name
        egfuse.fuse(model).save(out, external_data=True)
        assert references(out) == {f"{out.name}.data"}
        assert (tmp_path / f"{out.name}.data").stat().st_size > 0
        assert_same_outputs(model, onnx.load(out), feeds_for(model))


def test_saving_again_replaces_the_pair_and_its_old_weights(tmp_path):
    out = tmp_path / "out.onnx"
    for seed in (1, 2, 3):
        model = attention_model(Variant(seed=seed))
        egfuse.fuse(model, validate=False).save(out, external_data=True)
        (weights,) = references(out)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.onnx", weights])
        assert_same_outputs(model, onnx.load(out), feeds_for(model))
    egfuse.fuse(MODEL, validate=False).save(out)  # inline now: the old weights file goes
    assert [p.name for p in tmp_path.iterdir()] == ["out.onnx"]


def _old_pair(folder: Path) -> tuple[Path, dict[str, object]]:
    out = folder / "out.onnx"
    egfuse.fuse(attention_model(Variant(seed=1)), validate=False).save(out, external_data=True)
    return out, snapshot(folder)


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_failing_between_the_weights_and_the_model_leaves_the_old_pair(tmp_path, monkeypatch, failure):
    out, before = _old_pair(tmp_path)
    real_replace = os.replace

    def failing_replace(src, dst):
        if Path(dst) == out:  # the weights are published; the model is not yet
            assert len(list(tmp_path.iterdir())) == 4  # old pair, new weights, the temporary folder
            raise failure
        real_replace(src, dst)

    monkeypatch.setattr(save.os, "replace", failing_replace)
    with pytest.raises(EgfuseError if isinstance(failure, OSError) else KeyboardInterrupt):
        egfuse.fuse(attention_model(Variant(seed=2)), validate=False).save(out, external_data=True)
    assert snapshot(tmp_path) == before
    model = attention_model(Variant(seed=1))
    assert_same_outputs(model, onnx.load(out), feeds_for(model))


def test_failing_while_writing_leaves_the_old_pair(tmp_path, monkeypatch):
    out, before = _old_pair(tmp_path)
    real = save.protos.save_with_external_data

    def disk_full(model, path, **kwargs):
        real(model, path, **kwargs)  # a partial file written: then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(save.protos, "save_with_external_data", disk_full)
    with pytest.raises(EgfuseError, match="No space left"):
        egfuse.fuse(attention_model(Variant(seed=2)), validate=False).save(out, external_data=True)
    assert snapshot(tmp_path) == before


CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import numpy as np
    from onnx import helper, numpy_helper
    from egfuse.files import protos, save

    out, mode = Path(sys.argv[1]), sys.argv[2]
    weights = numpy_helper.from_array(np.full(50 << 18, 2.0, np.float32), "w")  # 50 MB
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [], [
        helper.make_tensor_value_info("y", 1, [50 << 18])], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if mode == "crash_between":  # as if killed between publishing the weights and the model
        real = save.os.replace
        save.os.replace = lambda src, dst: os._exit(3) if Path(dst) == out else real(src, dst)
    else:
        written = protos.save_with_external_data
        def slow(*args, **kwargs):
            written(*args, **kwargs)
            print("written", flush=True)
            time.sleep(60)
        protos.save_with_external_data = slow
    save.save_model(model, out, external_data=True)
    """
)


def _small_pair(folder: Path) -> Path:
    from onnx import helper, numpy_helper

    weights = numpy_helper.from_array(np.full(1000, 1.0, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", 1, [1000])],
        [weights],
    )
    out = folder / "out.onnx"
    save.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out, external_data=True)
    return out


def _old_values_load(out: Path) -> None:
    loaded = onnx.load(out)
    assert (onnx.numpy_helper.to_array(loaded.graph.initializer[0]) == 1.0).all()


@pytest.fixture
def child_saving():
    """Start a process saving a 50 MB model over ``out`` (``mode``: "sleep" once written, or "crash_between"
    the two renames); it is killed at the end of the test whatever happened."""
    children: list[subprocess.Popen] = []

    def start(out: Path, mode: str) -> subprocess.Popen:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(out), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        children.append(child)
        if mode != "crash_between":
            assert child.stdout.readline().strip() == "written", child.stderr.read()
        return child

    yield start
    for child in children:
        child.kill()
        child.communicate()


def test_sigterm_during_a_save_leaves_the_old_pair_and_no_temporaries(tmp_path, child_saving):
    out = _small_pair(tmp_path)
    before = snapshot(tmp_path)
    child = child_saving(out, "sleep")
    (temporary,) = (p for p in tmp_path.iterdir() if save.TEMP_MARK in p.name)
    assert sum(f.stat().st_size for f in temporary.iterdir()) > 50_000_000  # killed with the weights written
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == -signal.SIGTERM, child.stderr.read()
    assert snapshot(tmp_path) == before
    _old_values_load(out)


def test_a_kill_between_the_renames_leaves_a_whole_pair(tmp_path, child_saving):
    out = _small_pair(tmp_path)
    child = child_saving(out, "crash_between")
    assert child.wait(timeout=60) == 3, child.stderr.read()
    _old_values_load(out)  # the old model, with its own weights: the new weights file is not referenced


def test_sigkill_leftovers_are_removed_by_the_next_save_once_stale(tmp_path, child_saving):
    out = _small_pair(tmp_path)
    child = child_saving(out, "sleep")
    child.kill()
    child.wait(timeout=60)
    (left,) = (p for p in tmp_path.iterdir() if save.TEMP_MARK in p.name)  # SIGKILL cannot be cleaned up after
    live = tmp_path / f".other.onnx{save.TEMP_MARK}abcd1234"  # another process's save, going on now
    live.mkdir()
    (live / "other.onnx").write_bytes(b"partial")
    old = time.time() - 2 * save.STALE_SECONDS
    for path in (*left.iterdir(), left):
        os.utime(path, (old, old))
    egfuse.fuse(MODEL, validate=False).save(out)
    assert not left.exists() and live.exists()
