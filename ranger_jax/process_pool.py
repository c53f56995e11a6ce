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

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self, *, wait: bool = True) -> None:
        """Stops the worker processes (a later `run` starts new ones); `wait=False` does not wait for running jobs."""
        if self._executor is not None:
            self._executor.shutdown(wait=wait, cancel_futures=True)
            self._executor = None

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
            if self._executor is None:
                self._executor = concurrent.futures.ProcessPoolExecutor(
                    max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"))
            order = sorted(range(len(jobs)), key=lambda i: -costs[i]) if costs is not None else range(len(jobs))
            futures = {self._executor.submit(fn, *jobs[i]): i for i in order}
            try:
                for future in concurrent.futures.as_completed(futures):
                    i = futures[future]
                    try:
                        results[i] = future.result()
                    except BrokenProcessPool as error:
                        raise RuntimeError(
                            f"{desc}: a worker process died during job {labels[i]}: killed, out of memory, or the "
                            f"main script started this at import time (spawned workers import it: guard it with "
                            f"`if __name__ == \"__main__\":`); workers=1 runs every job in this process") from error
                    except Exception as error:
                        raise RuntimeError(f"{desc}: job {labels[i]} failed in a worker process: {error}") from error
                    bar.update()
            except BaseException:
                self.close(wait=False)
                raise
        return results


def run_jobs(fn: Callable[..., Any], jobs: Sequence[tuple], *, workers: int = 0,
             pool: JobPool | None = None, **options: Any) -> list[Any]:
    """`[fn(*job) for job in jobs]` on `pool`, or on a pool of `workers` processes opened for this call alone;
    `options` are `JobPool.run`'s (labels, costs, desc, progress). Results in the order of `jobs`."""
    if pool is not None:
        return pool.run(fn, jobs, **options)
    with JobPool(workers) as own:
        return own.run(fn, jobs, **options)
