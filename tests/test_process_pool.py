"""Jobs over spawned worker processes: results in the jobs' order, failures named, one pool for several runs."""

from __future__ import annotations

import os
import time

import pytest

from ranger_jax import process_pool

JOBS = [(2, 3), (3, 2), (5, 1), (7, 2), (2, 10)]


@pytest.mark.parametrize("workers", [1, 2])
def test_results_come_in_the_jobs_order_whatever_the_costs(workers):
    costs = [1, 5, 2, 9, 3]  # the largest start first; the results still follow the jobs
    assert process_pool.run_jobs(pow, JOBS, workers=workers, costs=costs, progress=False) == [8, 9, 5, 49, 1024]
    assert process_pool.run_jobs(pow, [], workers=workers, progress=False) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_job_is_named(workers):
    with pytest.raises(RuntimeError, match="squares: job second failed.*division") as caught:
        process_pool.run_jobs(divmod, [(4, 2), (1, 0), (9, 3)], workers=workers, labels=["first", "second", "third"],
                              desc="squares", progress=False)
    assert isinstance(caught.value.__cause__, ZeroDivisionError)


def test_one_pool_keeps_its_workers_across_runs():
    with process_pool.JobPool(2) as pool:
        first = pool.run(os.getpid, [()] * 6, progress=False)
        second = pool.run(os.getpid, [()] * 6, progress=False)
        assert pool.run(pow, [(3, 3)], progress=False) == [27]  # a single job still goes to the workers
    workers = set(first) | set(second)
    assert os.getpid() not in workers and len(workers) <= 2  # no process was started for the second run
    assert pool._executor is None  # closed with the block


def test_a_submitted_job_keeps_one_worker_while_runs_use_the_others():
    with process_pool.JobPool(2) as pool:
        slow = pool.submit(time.sleep, 4, label="the long one")
        pids = pool.run(os.getpid, [()] * 4, progress=False)
        assert not slow.done() and len(set(pids)) == 1  # every job of the run went to the other worker
        squared = pool.submit(pow, 2, 10)
    assert slow.done() and slow.result() is None  # closing the pool waited for it
    assert squared.result() == 1024  # the result outlives the pool


@pytest.mark.parametrize("workers", [1, 2])
def test_a_submitted_job_that_fails_is_named(workers):
    with process_pool.JobPool(workers) as pool:
        failing = pool.submit(divmod, 1, 0, label="the division")
    with pytest.raises(RuntimeError, match="job the division failed: .*division") as caught:
        failing.result()
    assert isinstance(caught.value.__cause__, ZeroDivisionError)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="workers must be an int >= 0"):
        process_pool.JobPool(-1)
    with pytest.raises(ValueError, match="workers must be an int >= 0"):
        process_pool.auto_workers(True)
    with pytest.raises(ValueError, match="2 labels for 3 jobs"):
        process_pool.run_jobs(pow, [(1, 1)] * 3, workers=1, labels=["a", "b"], progress=False)
    with pytest.raises(ValueError, match="1 costs for 3 jobs"):
        process_pool.run_jobs(pow, [(1, 1)] * 3, workers=1, costs=[1], progress=False)
    assert 1 <= process_pool.auto_workers(0) <= process_pool.MAX_AUTO_WORKERS
    assert process_pool.auto_workers(3) == 3
