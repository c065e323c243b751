"""Fan-out: one function over many independent jobs, in local processes or on a Ray cluster.

Fusing a model zoo (``egfuse optimize FOLDER -j N``) and the experiments are thousands of independent jobs.
Each runs in a process of its own, started by *spawn*: a process forked from one that has run onnxruntime can
hang, and a job that crashes its process (a segfault in a kernel) must cost that job, not the run. Results
come back as they finish, so a caller can record each one at once (its cache, its progress line) and an
interrupted run resumes from what it recorded. Ray is optional (``pip install 'egfuse[ray]'``): given a
cluster's address, the same jobs run there — its workers must see the same files.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from egfuse.errors import EgfuseError

__all__ = ["Crashed", "fan_out"]

_SPAWN = multiprocessing.get_context("spawn")


class Crashed(Exception):
    """A job whose process died (a crash in native code, the memory killer): its result is this error."""


def fan_out(
    function: Callable[..., Any], jobs: Sequence[tuple], *, workers: int = 1, ray_address: str | None = None
) -> Iterator[tuple[int, Any]]:
    """``function(*job)`` for every job, yielded as ``(index, result)`` in the order they finish; a job that
    raised yields its exception, one whose process died yields :class:`Crashed`. ``workers`` processes run at
    once (1: in this process, in order — nothing to start, and a debugger sees the job); ``ray_address``
    sends the jobs to that Ray cluster instead ("auto": the one this machine belongs to)."""
    if ray_address is not None:
        return _on_ray(function, jobs, _ray(ray_address))  # a missing Ray is said now, before any job
    if workers <= 1:
        return ((index, _called(function, job)) for index, job in enumerate(jobs))
    return _in_processes(function, jobs, workers)


def _called(function: Callable[..., Any], job: tuple) -> Any:
    try:
        return function(*job)
    except Exception as error:  # the caller records it as that job's outcome
        return error


def _in_processes(function: Callable[..., Any], jobs: Sequence[tuple], workers: int) -> Iterator[tuple[int, Any]]:
    """A pool of spawned processes. When one dies the pool is broken and every unfinished job with it; those
    are run again each in a pool of its own, so only the job that crashes again is :class:`Crashed`. A caller
    that stops reading (a time budget) waits for the running jobs only."""
    unfinished: list[int] = []
    pool = ProcessPoolExecutor(workers, mp_context=_SPAWN)
    try:
        futures: dict[Future, int] = {pool.submit(_called, function, job): i for i, job in enumerate(jobs)}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                try:
                    yield futures[future], future.result()
                except BrokenProcessPool:
                    unfinished.append(futures[future])
    finally:  # also when the caller stops early (a time budget): the jobs not started are dropped
        pool.shutdown(wait=True, cancel_futures=True)
    for index in sorted(unfinished):
        with ProcessPoolExecutor(1, mp_context=_SPAWN) as alone:
            try:
                yield index, alone.submit(_called, function, jobs[index]).result()
            except BrokenProcessPool:
                yield index, Crashed("its process died (a crash in native code, or the memory killer)")


def _ray(address: str) -> Any:
    try:
        import ray
    except ImportError:
        raise EgfuseError(
            f"--ray {address}: Ray is not installed (pip install 'egfuse[ray]'), or run without --ray"
        ) from None
    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    return ray


def _on_ray(function: Callable[..., Any], jobs: Sequence[tuple], ray: Any) -> Iterator[tuple[int, Any]]:
    remote = ray.remote(_called)
    refs = {remote.remote(function, job): i for i, job in enumerate(jobs)}
    while refs:
        ready, _ = ray.wait(list(refs), num_returns=1)
        index = refs.pop(ready[0])
        try:
            yield index, ray.get(ready[0])
        except Exception as error:  # the worker died (ray.exceptions.WorkerCrashedError) or was lost
            yield index, Crashed(f"its Ray worker failed: {type(error).__name__}")
