"""Independent pure-Python jobs over a few processes, results in the jobs' order.

Building offline worlds and playing the scripted teacher are pure Python: one core works while the others idle.
`run_jobs` spreads such jobs over worker processes and returns their results in the order the jobs were given, so a
caller that consumes them in order writes exactly what a serial loop writes. Workers are spawned (not forked): the
parent has usually imported JAX, whose threads do not survive a fork.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import tqdm

MAX_AUTO_WORKERS = 8


def auto_workers(requested: int) -> int:
    """Worker processes for `requested` (0: this process's usable cores, at most `MAX_AUTO_WORKERS`)."""
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
        raise ValueError(f"workers must be an int >= 0 (0: one per usable core); got {requested!r}")
    if requested:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, MAX_AUTO_WORKERS))


class JobPool:
    """Up to `workers` spawned processes, started at the first call that needs them and kept for the next calls
    (each worker imports the job's modules once), until `close` or the end of a `with` block.

    Args:
        workers: processes to use (0: one per usable core, at most `MAX_AUTO_WORKERS`); 1 runs every job in this
            process.
    """

    def __init__(self, workers: int = 0):
        self.workers = auto_workers(workers)
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None

    def __enter__(self) -> "JobPool":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(wait=exc_type is None)  # a block left by an exception does not wait for submitted jobs

    def close(self, *, wait: bool = True) -> None:
        """Stops the worker processes (a later `run` starts new ones) once every submitted job has run; `wait=False`
        cancels the jobs not started and does not wait for running ones."""
        if self._executor is not None:
            self._executor.shutdown(wait=wait, cancel_futures=not wait)
            self._executor = None

    def submit(self, fn: Callable[..., Any], *args: Any, label: str = "job") -> "PendingJob":
        """Starts `fn(*args)` on a worker and returns at once; `.result()` waits for it. Jobs start in the order
        they are submitted (those of a later `run` included), so a long job submitted first keeps one worker while
        the others take the jobs after it. With one worker it runs here, now.

        A failure is raised by `.result()` as `RuntimeError` naming `label`; jobs still pending when the pool is
        closed run to the end first (`close(wait=True)`), so a result can be read after the pool's `with` block."""
        pending = concurrent.futures.Future()
        if self.workers <= 1:
            try:
                pending.set_result(fn(*args))
            except Exception as error:
                pending.set_exception(error)
            return PendingJob(pending, label)
        return PendingJob(self._started().submit(fn, *args), label)

    def _started(self) -> concurrent.futures.ProcessPoolExecutor:
        """The pool's executor, started on first use (spawned workers: see the module docstring)."""
        if self._executor is None:
            self._executor = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self._executor

    def run(self, fn: Callable[..., Any], jobs: Sequence[tuple], *, labels: Sequence[str] | None = None,
            costs: Sequence[float] | None = None, desc: str = "jobs", progress: bool = True) -> list[Any]:
        """`[fn(*job) for job in jobs]`, computed by the pool's processes.

        Args:
            fn: a module-level function (workers import it by name); its arguments and result must pickle.
            jobs: one argument tuple per call.
            labels: a name per job for errors (default: the job's index).
            costs: relative sizes; larger jobs start first, so the last one to finish is a small one.
            desc: progress bar title.
            progress: show a progress bar over finished jobs.

        Returns:
            The results, in the order of `jobs`.

        Raises:
            RuntimeError: naming the job that failed (the worker's exception is its cause), or the pool that broke
                (a worker killed, e.g. out of memory); the pool is closed then.
        """
        jobs = [tuple(job) for job in jobs]
        labels = [str(i) for i in range(len(jobs))] if labels is None else [str(label) for label in labels]
        if len(labels) != len(jobs):
            raise ValueError(f"JobPool.run got {len(labels)} labels for {len(jobs)} jobs")
        if costs is not None and len(costs) != len(jobs):
            raise ValueError(f"JobPool.run got {len(costs)} costs for {len(jobs)} jobs")
        results: list[Any] = [None] * len(jobs)
        with tqdm.tqdm(total=len(jobs), desc=desc, disable=not progress) as bar:
            if self.workers <= 1 or (len(jobs) <= 1 and self._executor is None):
                for i, job in enumerate(jobs):
                    try:
                        results[i] = fn(*job)
                    except Exception as error:
                        raise RuntimeError(f"{desc}: job {labels[i]} failed: {error}") from error
                    bar.update()
                return results
            executor = self._started()
            order = sorted(range(len(jobs)), key=lambda i: -costs[i]) if costs is not None else range(len(jobs))
            futures = {executor.submit(fn, *jobs[i]): i for i in order}
            try:
                for future in concurrent.futures.as_completed(futures):
                    i = futures[future]
                    try:
                        results[i] = future.result()
                    except BrokenProcessPool as error:
                        raise RuntimeError(f"{desc}: {_worker_died(labels[i])}; workers=1 runs every job in this "
                                           f"process") from error
                    except Exception as error:
                        raise RuntimeError(f"{desc}: job {labels[i]} failed in a worker process: {error}") from error
                    bar.update()
            except BaseException:
                self.close(wait=False)
                raise
        return results


def _worker_died(label: str) -> str:
    return (f"a worker process died during job {label}: killed, out of memory, or the main script started this at "
            f"import time (spawned workers import it: guard it with `if __name__ == \"__main__\":`)")


class PendingJob:
    """A job `JobPool.submit` started: `result()` waits for its value."""

    def __init__(self, future: concurrent.futures.Future, label: str):
        self._future, self.label = future, label

    def done(self) -> bool:
        """Whether the job has ended (its result or its failure is in)."""
        return self._future.done()

    def result(self) -> Any:
        """The job's value.

        Raises:
            RuntimeError: naming the job, with the worker's exception as its cause (or the pool that broke, or was
                closed without waiting for the job).
        """
        try:
            return self._future.result()
        except BrokenProcessPool as error:
            raise RuntimeError(_worker_died(self.label)) from error
        except concurrent.futures.CancelledError as error:
            raise RuntimeError(f"job {self.label} was cancelled: its pool was closed before it ran") from error
        except Exception as error:
            raise RuntimeError(f"job {self.label} failed: {error}") from error


def run_jobs(fn: Callable[..., Any], jobs: Sequence[tuple], *, workers: int = 0,
             pool: JobPool | None = None, **options: Any) -> list[Any]:
    """`[fn(*job) for job in jobs]` on `pool`, or on a pool of `workers` processes opened for this call alone;
    `options` are `JobPool.run`'s (labels, costs, desc, progress). Results in the order of `jobs`."""
    if pool is not None:
        return pool.run(fn, jobs, **options)
    with JobPool(workers) as own:
        return own.run(fn, jobs, **options)
