"""The original model's side of validation, run ahead in a second process while the search goes on.

Validation runs the original and the fused model on the same feeds. The original's half — generating the feeds,
the memory estimate, a session, a run per feed set — does not depend on what the search writes, only on which
values it will compare: the outputs of the regions the search found, which are known before a single rule runs.
So once the regions are found (:func:`egfuse.search.fuse_once`'s ``on_found``), a child forked from this process
computes the original's outputs on every feed set validation will use, for every region found (a superset of
those that will be fused), while the parent saturates, extracts and writes on the other core. The judge then reads
them (:func:`egfuse.validation.runner.precomputed`) where it would have run the original, and only the fused model
is run after the search. On a 48-layer BERT that takes more than half of validation off the critical path
(0.29-0.47 s → 0.13-0.15 s on a 2-core machine).

It is only an earlier copy of the same computation: the child calls the same functions
(:func:`~egfuse.validation.runner.original_outputs`, :func:`~egfuse.validation.runner.run`) on the same model object,
with the same settings, and what it returns is used only where the model, the feeds (compared by value) and the
names asked all match; anything else — a child that fails, is killed, or has not finished within
:data:`WAIT_SECONDS` — leaves the judge to run the original itself, as it does without this module. The same
numbers, the same verdicts; only sooner.

Where it runs: Linux (``fork``: the child shares the parent's model without copying it, and imports nothing —
a spawned one takes longer to import onnxruntime than a small model takes to fuse), with a second CPU this
process may use, on a model small enough that a second session costs little (:data:`MAX_MODEL_BYTES`), weights
in memory (not in files), the CPU execution provider, and ``Settings.ahead`` left on.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import onnx

from egfuse.files import protos
from egfuse.validation import inputs, runner

__all__ = ["MAX_MODEL_BYTES", "WAIT_SECONDS", "OriginalAhead", "ahead"]

MAX_MODEL_BYTES = runner.KEEP_BYTES
"""Models up to this many bytes of weights are run ahead: the child's session holds a second copy of them while
the parent's fused session holds the first, which for a large model is the memory validation must not double."""

WAIT_SECONDS = 30.0
"""How long the judge waits for a child still running when it needs the original's outputs. A small model's
runs take well under a second; a child that takes longer is stuck (a fork inherits no other thread, and a lock
one of them held stays held) and is killed, and the judge runs the original itself."""


@dataclass
class OriginalAhead:
    """One child computing the original's outputs: started once the regions are found, read by the judge."""

    original: onnx.ModelProto
    feeds: dict | None
    budget: int | None
    enabled: bool
    pid: int | None = None
    path: str | None = None
    _collected: runner.Precomputed | None = None
    _done: bool = False

    @staticmethod
    def runs_here() -> bool:
        """Whether this process, with the validation settings in force, runs the original ahead at all (whatever
        the model)."""
        settings = runner.current()
        cpu_only = tuple(settings.providers) == ("CPUExecutionProvider",)
        return settings.ahead and cpu_only and _can_fork() and _usable_cpus() >= 2

    def start(self, names: list[str]) -> None:
        """Fork the child that runs the original with ``names`` (every region found) as extra outputs; called
        by the search for each search, acted on once."""
        if not self.enabled or self.pid is not None or self._done:
            return
        if not names:  # no region: nothing will be fused, nothing judged (a later search may find some)
            return
        present = {out for node in self.original.graph.node for out in node.output}
        names = [name for name in dict.fromkeys(names) if name in present]
        try:
            handle, self.path = tempfile.mkstemp(prefix="egfuse-ahead-", suffix=".pickle")
            os.close(handle)
            pid = os.fork()
        except OSError:  # no file or no process to be had: the judge runs the original itself
            self._done = True
            self._discard()
            return
        if pid == 0:  # the child: compute, write, and leave without running the parent's exit handlers
            code = 1
            try:
                _write(self.path, _original_runs(self.original, self.feeds, names, self.budget))
                code = 0
            finally:
                os._exit(code)
        self.pid = pid

    def precomputed(self) -> runner.Precomputed | None:
        """What the child computed (waiting for it up to :data:`WAIT_SECONDS`), or None where it failed."""
        if self.pid is None or self._done:
            return self._collected
        self._done = True
        try:
            status = _wait(self.pid, WAIT_SECONDS)
        except ChildProcessError:  # reaped by someone else (a host that ignores SIGCHLD): as if it had failed
            status = None
        self.pid = None
        if status == 0:
            try:
                with open(self.path, "rb") as file:
                    data, expected, more = pickle.load(file)
                self._collected = runner.Precomputed(self.original, self.feeds, data, expected, more)
            except Exception:  # unreadable: as if it had failed
                self._collected = None
        self._discard()
        return self._collected

    def close(self) -> None:
        """The child stopped (if still running) and its file removed: the search found nothing to judge, or
        failed."""
        if self.pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, 9)
            with contextlib.suppress(OSError):
                os.waitpid(self.pid, 0)
            self.pid = None
        self._done = True
        self._discard()

    def _discard(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            self.path = None


@contextlib.contextmanager
def ahead(
    original: onnx.ModelProto,
    feeds: dict | None,
    budget: int | None,
    *,
    validate: bool,
    weights: protos.DetachedWeights | None,
) -> Iterator[OriginalAhead]:
    """An :class:`OriginalAhead` for one search and judge, enabled where it can run here (the module's
    docstring), its child never outliving the block."""
    enabled = validate and weights is None and OriginalAhead.runs_here() and _small(original)
    early = OriginalAhead(original, feeds, budget, enabled)
    try:
        yield early
    finally:
        early.close()


def _original_runs(
    original: onnx.ModelProto, feeds: dict | None, names: list[str], budget: int | None
) -> tuple[dict, dict, list[tuple[dict, dict]]]:
    """In the child: the judge's runs of the original (:func:`egfuse.validation.judge.judge`) — its feeds and
    outputs, then each mask-exercising feed set's outputs (generated feeds only, as the judge runs them)."""
    with runner.kept_sessions(), runner.without_spinning():
        data, expected = runner.original_outputs(original, feeds, names, budget=budget)
        more = []
        if feeds is None:
            for masked in inputs.mask_feed_sets(data).values():
                try:
                    more.append((masked, runner.run(original, masked, names)))
                except Exception:  # the judge finds the same: these feeds say nothing
                    continue
    return data, expected, more


def _write(path: str, result: object) -> None:
    with open(path, "wb") as file:
        pickle.dump(result, file, protocol=pickle.HIGHEST_PROTOCOL)


def _wait(pid: int, seconds: float) -> int | None:
    """The child's exit code, or None where it died by a signal or was killed after ``seconds``."""
    deadline = time.perf_counter() + seconds
    delay = 0.0005
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None
        if time.perf_counter() > deadline:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
            os.waitpid(pid, 0)
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def _can_fork() -> bool:
    return sys.platform == "linux" and hasattr(os, "fork")


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _small(model: onnx.ModelProto) -> bool:
    return protos.weight_bytes(model) <= MAX_MODEL_BYTES
