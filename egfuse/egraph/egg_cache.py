"""Where the program text of :mod:`egfuse.egraph.egg_program` is kept between processes: a file in the user's
cache folder under a hash of egglog's version and of every egfuse source, written atomically, read back only
when its hash is the current one, and removed once a month unread. The cache saves time; it is never needed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from egfuse.egraph.rule_reach import Reach

__all__ = ["Base", "Rules", "cache_folder", "path_for", "read", "source_hash", "write"]

_FORMAT = 2  # bump when the file's layout changes


@dataclass(frozen=True)
class Base:
    """The language: its sort and functions, ``egfuse_ref`` and the permutation tables."""

    commands: tuple[str, ...]
    names: dict[str, str]
    """Python name of a constructor or fact (``matmul``, ``rank_of``, ``ref``) → its egglog name."""
    sort: str
    """egglog's name of the Tensor sort."""
    sized: frozenset[str]
    """The functions an e-graph's size counts: those declared through egglog-python (not ``egfuse_ref``)."""


@dataclass(frozen=True)
class Rules:
    """A ruleset's commands, to be run after the base's."""

    commands: tuple[str, ...]
    run: str
    """The command that runs the ruleset once (one iteration)."""
    rule_names: dict[str, str]
    """egglog's name of a replayed rule (as :mod:`egfuse.egraph.egg_program` reads it) → its stable name
    (``masks.12``, :func:`egfuse.rules.rule_names`): what run reports count matches by."""
    sized: frozenset[str]
    """The base's and those the rules declare."""
    reach: Reach = ()
    """Per command: None, or a rule's constructors needed and built (:func:`egfuse.egraph.rule_reach.analysed`);
    empty where not read yet."""


def cache_folder() -> Path | None:
    """Where program files are kept; None where ``EGFUSE_CACHE_DIR`` is set empty (no file)."""
    chosen = os.environ.get("EGFUSE_CACHE_DIR")
    if chosen is not None:
        return Path(chosen) if chosen else None
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "egfuse"


_SOURCE_HASH: list[str] = []


def source_hash() -> str:
    """egglog's version and every source file of egfuse and its rules: what the program text depends on."""
    if not _SOURCE_HASH:
        from importlib import metadata

        import egfuse
        from egfuse import rules

        digest = hashlib.sha256(f"{_FORMAT} egglog {metadata.version('egglog')}".encode())
        for folder in (Path(egfuse.__file__).parent, Path(rules.__file__).parent):  # the rules may live apart
            for path in sorted(folder.rglob("*.py")):  # every subpackage: the language may move into one
                digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
        _SOURCE_HASH.append(digest.hexdigest()[:32])
    return _SOURCE_HASH[0]


def path_for(families: tuple[str, ...] | None, base: bool) -> Path | None:
    folder = cache_folder()
    if folder is None:
        return None
    what = "base" if base else "rules-" + "-".join(("core", *(families or ())))
    return folder / f"egg-program-{source_hash()}-{what}.json"


def read(path: Path, with_rules: bool) -> tuple[Base, Rules | None] | None:
    try:
        data = json.loads(path.read_text())
        if data.get("source") != source_hash():
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # in use: not pruned
        b = data["base"]
        base = Base(tuple(b["commands"]), dict(b["names"]), b["sort"], frozenset(b["sized"]))
        if not with_rules:
            return base, None
        r = data["rules"]
        reach = tuple(None if x is None else (tuple(x[0]), tuple(x[1])) for x in r["reach"])
        if len(reach) != len(r["commands"]):
            return None
        return base, Rules(tuple(r["commands"]), r["run"], dict(r["rule_names"]), frozenset(r["sized"]), reach)
    except (OSError, ValueError, KeyError, TypeError):  # absent, partly written by an older egfuse, unreadable
        return None


def write(path: Path, base: Base, rules: Rules | None) -> None:
    """Atomically (a reader sees the old file or the new, whole), and silently where the folder is not
    writable: the cache saves time, it is never needed."""
    data: dict = {"source": source_hash(), "base": {"commands": base.commands, "names": base.names, "sort": base.sort,
                                                    "sized": sorted(base.sized)}}  # fmt: skip
    if rules is not None:
        data["rules"] = {"commands": rules.commands, "run": rules.run, "rule_names": rules.rule_names,
                         "sized": sorted(rules.sized), "reach": rules.reach}  # fmt: skip
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as f:
            temporary = f.name
            json.dump(data, f)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        return
    prune(path.parent)


_STALE_SECONDS = 30 * 24 * 3600


def prune(folder: Path) -> None:
    """Files of other sources (an older egfuse or egglog) unread for a month go: each edit of the rules makes
    new ones, and nothing else would ever remove the old (a read touches its file, :func:`read`)."""
    now = time.time()
    for old in folder.glob("egg-program-*.json"):
        if source_hash() in old.name:
            continue
        with contextlib.suppress(OSError):
            if now - old.stat().st_mtime > _STALE_SECONDS:
                old.unlink()
