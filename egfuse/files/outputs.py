"""Outputs: decide, before anything is written, whether a set of output paths is safe to write.

Safe means: none of them is an input (a model, its weights, a feeds file) or another output (or the weights
file beside one), each is a regular file or nothing yet, and each is in a folder that exists and takes new
files. Checked up front because a failure found after a long run — or half-way through writing — costs the
user either the run or a file."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from egfuse.errors import UnsafeOutputError

_KINDS = (
    (stat.S_ISLNK, "a symbolic link (egfuse would replace the link, not write where it points)"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


def weights_file(model: Path) -> Path:
    """Where a model's weights go by default: ``<name>.data`` beside it."""
    return model.with_name(f"{model.name}.data")


def model_inputs(files: Sequence[Path]) -> dict[Path, str]:
    """``files`` as :func:`egfuse.files.load.model_files` lists them (the model first), each with what it is."""
    return {file: "the input model" if i == 0 else "the input's weights" for i, file in enumerate(files)}


def check_outputs(
    outputs: Mapping[str, Path | None], inputs: Mapping[Path, str] | None = None, *, make_folders: bool = False
) -> None:
    """Raise :class:`UnsafeOutputError` for the first output that is not safe to write. ``outputs`` maps what
    each one is, in the user's words ("the report (--report)"), to its path (None: not asked for); ``inputs``
    maps the files read to what they are. ``make_folders``: a missing folder will be created, so only its
    nearest existing ancestor must take new files."""
    given = {what: Path(path) for what, path in outputs.items() if path is not None}
    for what, path in given.items():
        _check_target(what, path, make_folders)
    for i, (what, path) in enumerate(given.items()):
        for file, role in (inputs or {}).items():
            if _same_file(path, file):
                raise _refuse(what, path, f"it is {role}")
        for j, (other_what, other) in enumerate(given.items()):
            if j < i and _same_file(path, other):  # the later of the two is the one to change
                raise _refuse(what, path, f"it is also where {other_what} goes")
            if j != i and _same_file(path, weights_file(other)):
                raise _refuse(what, path, f"it is where the weights of {other_what} go")


def name_max(folder: Path) -> int:
    """The longest file name ``folder``'s filesystem takes, in bytes (255 where it cannot be asked)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # (no pathconf on Windows)
        return 255


def _refuse(what: str, path: Path, reason: str) -> UnsafeOutputError:
    return UnsafeOutputError(f"refusing to write {what} here: {reason}", path=str(path))


def _check_target(what: str, path: Path, make_folders: bool) -> None:
    if os.fspath(path) in ("", "."):
        raise _refuse(what, path, "the path is empty or the current folder, not a file name")
    folder = _existing_folder(what, path, make_folders)
    limit = name_max(folder)
    if len(os.fsencode(path.name)) > limit:
        raise _refuse(what, path, f"the file name is too long for its filesystem ({len(path.name)} > {limit} bytes)")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise _refuse(what, path, f"it cannot be checked ({err.strerror})") from None
    for test, kind in _KINDS:
        if test(mode):
            raise _refuse(what, path, f"it is {kind}, not a regular file")
    if not stat.S_ISREG(mode):
        raise _refuse(what, path, "it is not a regular file")


def _existing_folder(what: str, path: Path, make_folders: bool) -> Path:
    """The folder ``path`` goes in (or, with ``make_folders``, its nearest existing ancestor), refused unless it
    is a folder that takes new files."""
    folder = path.parent
    while True:
        try:
            mode = os.stat(folder).st_mode
        except FileNotFoundError:
            if not make_folders:
                raise _refuse(what, path, f"the folder {folder} does not exist") from None
            folder = folder.parent
            continue
        except NotADirectoryError:
            raise _refuse(what, path, f"{_file_above(folder)} is a file, not a folder") from None
        except OSError as err:
            raise _refuse(what, path, f"its folder {folder} cannot be checked ({err.strerror})") from None
        break
    if not stat.S_ISDIR(mode):
        raise _refuse(what, path, f"{folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _refuse(what, path, f"the folder {folder} is not writable")
    return folder


def _file_above(folder: Path) -> Path:
    """The first part of ``folder`` that is not a folder (what ENOTDIR is about)."""
    for part in reversed([folder, *folder.parents]):
        if part.exists() and not part.is_dir():
            return part
    return folder


def _same_file(a: Path, b: Path) -> bool:
    """Whether writing ``a`` writes ``b``: the same path once links are followed (a link at an input's path is
    read through, so its target is the input), or another name (a hard link) of the same file."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): not the same file
        return False
