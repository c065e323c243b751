"""Where a long run is: the stages report what they are doing, a listener (the CLI's status line on a
terminal) shows it. Nothing is shown unless someone listens, so the library stays silent."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_LISTENER: ContextVar[Callable[[str], None] | None] = ContextVar("egfuse_progress", default=None)


def stage(text: str) -> None:
    """Say what the run is doing now (``"validating: round 1, 12 regions"``)."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(text)


@contextmanager
def listening(listener: Callable[[str], None] | None) -> Iterator[None]:
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


@contextmanager
def status_line(enabled: bool, stream=sys.stderr, every: float = 0.5) -> Iterator[None]:
    """One line on ``stream``, rewritten in place with the current stage and the time elapsed — only where
    ``enabled`` (a terminal, and not ``--quiet``); erased at the end so the report prints on a clean line."""
    if not enabled:
        yield
        return
    start, current, done = time.perf_counter(), ["starting"], threading.Event()

    def draw() -> None:
        line = f"egfuse: {current[0]} … {time.perf_counter() - start:.0f}s"
        stream.write("\r" + line[:119].ljust(119))
        stream.flush()

    def tick() -> None:
        while not done.wait(every):
            draw()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        with listening(lambda text: current.__setitem__(0, text)):
            yield
    finally:
        done.set()
        ticker.join()
        stream.write("\r" + " " * 119 + "\r")
        stream.flush()
