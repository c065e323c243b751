"""Save: outputs written so that a crash leaves the old files or the new ones — never half of one, never a
model beside weights that are not its own.

A model with external data is two files, and two renames cannot be atomic together; so they are never renamed
over one another. Both are written into a temporary folder beside the target (same filesystem: a rename there
is atomic). The weights file is published first, under a name no file has yet (``<name>.data``, or
``<name>.<random>.data`` when that one is taken, by the previous version or by an input): nothing references
it yet, so the old pair is still whole. Then ONE rename puts the model, which references it, in place: from
then on the new pair is whole. Last, the weights file the old model referenced is removed, when its name says
it was written here for that model and it is not an input. SIGINT/SIGTERM during the write remove the
temporaries (then take their usual course); what a SIGKILL leaves is removed by a later save in that folder
once it is an hour old."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

import onnx

from egfuse.errors import EgfuseError, UnsafeOutputError
from egfuse.files import protos
from egfuse.files.outputs import check_outputs, name_max

T = TypeVar("T")

TEMP_MARK = ".egfuse-tmp-"
"""In the name of every temporary a save makes (``.<name>.egfuse-tmp-<random>``): what stale clean-up removes."""

STALE_SECONDS = 3600.0
"""A temporary untouched this long was left by a killed process (a live save keeps writing into its own)."""

_OLD_MODEL_BYTES = 64 << 20
"""An old model at the target is read for the weights files it references only below this size: a model that
keeps its weights outside is small, and reading a large one in full would cost its size in memory."""


def save_model(
    model: onnx.ModelProto,
    path: Path,
    *,
    external_data: bool | None = None,
    inputs: Mapping[Path, str] | None = None,
    weights_folder: Path | None = None,
) -> None:
    """Write ``model`` at ``path`` (and its weights beside it, with ``external_data``; by default only past
    protobuf's 2 GB) by the protocol above. ``inputs``: the files the model was read from, never written over
    nor removed. ``weights_folder``: where tensors ``model`` keeps in files are (streamed from there into the
    new weights file, one at a time). Missing folders are created."""
    path = Path(path)
    check_outputs({"the model": path}, inputs, make_folders=True)
    if external_data is None:
        external_data = protos.is_large(model)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EgfuseError(f"its folder could not be made: {err.strerror or err}", path=str(path)) from None
    remove_stale_temporaries(path.parent)
    previous = _our_weights_of(path)
    data_name = _fresh_weights_name(path) if external_data else None
    _interruptible(lambda: _write_and_publish(model, path, data_name, weights_folder))
    for name in previous - {data_name}:
        old = path.with_name(name)
        if not any(_is(old, file) for file in inputs or ()):
            with suppress(OSError):  # the new pair is in place: a stray old weights file is no failure
                old.unlink(missing_ok=True)


def write_text(path: Path, text: str, inputs: Mapping[Path, str] | None = None) -> None:
    """Write ``text`` at ``path`` by a temporary file renamed into place: the old file or the new one."""
    path = Path(path)
    check_outputs({"the file": path}, inputs)
    remove_stale_temporaries(path.parent)
    _interruptible(lambda: _write_text(path, text))


def remove_stale_temporaries(folder: Path) -> None:
    """Remove what killed saves left in ``folder``: temporaries not written to for :data:`STALE_SECONDS`."""
    try:
        entries = [e for e in os.scandir(folder) if e.name.startswith(".") and TEMP_MARK in e.name]
    except OSError:
        return
    now = time.time()
    for entry in entries:
        try:
            if entry.is_symlink() or now - _last_write(entry) < STALE_SECONDS:
                continue
            if entry.is_dir():
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:
            continue  # gone meanwhile, or not ours to remove: never a reason to fail a save


def _last_write(entry: os.DirEntry) -> float:
    """When ``entry`` (a temporary file, or a folder and the files in it) was last written to."""
    latest = entry.stat(follow_symlinks=False).st_mtime
    if entry.is_dir(follow_symlinks=False):
        with os.scandir(entry.path) as inner:
            latest = max([latest, *(e.stat(follow_symlinks=False).st_mtime for e in inner)])
    return latest


def _temp_prefix(path: Path) -> str:
    """Short enough that any target name leaves room for it and the random part, however long the name."""
    return f".{path.name[:40]}{TEMP_MARK}"


def _write_and_publish(model: onnx.ModelProto, path: Path, data_name: str | None, folder: Path | None) -> None:
    try:
        with _staging(path) as workdir:
            staged = workdir / path.name
            _write(model, staged, data_name, folder)
            if data_name:
                _publish_pair(staged, workdir / data_name, path)
            else:
                _fsync(staged)
                os.replace(staged, path)
    except OSError as err:  # a full disk, a folder gone meanwhile: the old files are as they were
        raise EgfuseError(f"could not be written: {err.strerror or err}", path=str(path)) from None
    _fsync(path.parent)


def _write(model: onnx.ModelProto, staged: Path, data_name: str | None, folder: Path | None) -> None:
    if data_name:  # streamed tensor by tensor: no second copy of the weights in memory
        protos.save_with_external_data(model, staged, data_name=data_name, weights_folder=folder)
        return
    try:
        onnx.save_model(model, staged)
    except ValueError as err:  # protobuf's 2 GB limit
        raise EgfuseError(f"could not be written ({err}); save with external_data=True", path=staged.name) from None


def _publish_pair(staged: Path, staged_data: Path, path: Path) -> None:
    """The weights under their fresh name, then the model by one rename; the weights go again if that fails."""
    data = path.with_name(staged_data.name)
    if os.path.lexists(data):  # it appeared since the name was chosen: someone else's now
        raise UnsafeOutputError(f"{data.name} appeared beside it while writing; try again", path=str(path))
    _fsync(staged_data)
    _fsync(staged)
    os.replace(staged_data, data)
    try:
        os.replace(staged, path)
    except BaseException:
        data.unlink(missing_ok=True)
        raise


def _write_text(path: Path, text: str) -> None:
    fd, name = tempfile.mkstemp(prefix=_temp_prefix(path), dir=path.parent)
    temp = Path(name)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except OSError as err:
        raise EgfuseError(f"could not be written: {err.strerror or err}", path=str(path)) from None
    finally:
        temp.unlink(missing_ok=True)


@contextmanager
def _staging(path: Path) -> Iterator[Path]:
    """A temporary folder beside ``path``, removed afterwards whatever happens."""
    workdir = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), dir=path.parent))
    try:
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _fresh_weights_name(path: Path) -> str:
    """A name for the weights file that no file has: ``<name>.data`` if free, else with a random part."""
    for name in (f"{path.name}.data", *(f"{path.name}.{secrets.token_hex(4)}.data" for _ in range(8))):
        if len(os.fsencode(name)) > name_max(path.parent):
            raise UnsafeOutputError(
                f"the name is too long to write its weights file {name!r} beside it; choose a shorter one",
                path=str(path),
            )
        if not os.path.lexists(path.with_name(name)):
            return name
    raise UnsafeOutputError("no free name for its weights file beside it", path=str(path))


def _our_weights_of(path: Path) -> set[str]:
    """The weights files the model now at ``path`` references that a save of it wrote (by their names)."""
    try:
        if not path.is_file() or path.stat().st_size > _OLD_MODEL_BYTES:
            return set()
        old = onnx.load(str(path), load_external_data=False)
    except Exception:  # not a model (any more): it references nothing to clean up
        return set()
    ours = re.compile(re.escape(path.name) + r"(\.[0-9a-f]{8})?\.data")
    tensors = onnx.external_data_helper._get_all_tensors(old)
    locations = {e.value for t in tensors for e in t.external_data if e.key == "location"}
    return {loc for loc in locations if ours.fullmatch(loc)}


def _is(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _fsync(path: Path) -> None:
    """Flush ``path`` (a file, or a folder's entries) to disk: a rename must not outlive the data it names."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot sync a folder: the rename is still atomic
    finally:
        os.close(fd)


class _Interrupted(BaseException):
    """A signal arrived during a write; a BaseException so that no ``except Exception`` on the way stops it
    before the ``finally`` clauses have removed the temporaries."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _interruptible(write: Callable[[], T]) -> T:
    """Run ``write`` with SIGINT and SIGTERM raising inside it, so its clean-up runs; then hand the signal to
    the handler that was there before (SIGTERM's default ends the process, as it would have)."""
    if threading.current_thread() is not threading.main_thread():
        return write()  # only the main thread can set handlers (and receives the signals)
    caught: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        if not caught:  # a second signal must not interrupt the clean-up of the first
            caught.append(signum)
            raise _Interrupted(signum)

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) not in (signal.SIG_IGN, None):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        return write()
    except _Interrupted:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    signal.raise_signal(caught[0])
    raise KeyboardInterrupt  # the previous handler returned: the write still did not happen
