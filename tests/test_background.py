"""BackgroundLoop: sync callers on many threads share one loop; results, errors, close and restart."""

import asyncio
import threading

import pytest

from ranger_jax import background


def test_callers_on_many_threads_run_concurrently_on_one_loop():
    runner = background.BackgroundLoop("test")
    loops, started, release = set(), [], asyncio.Event()

    async def wait_for_all(i: int) -> int:
        loops.add(asyncio.get_running_loop())
        started.append(i)
        if len(started) == 4:
            release.set()
        await asyncio.wait_for(release.wait(), 5.0)  # only returns if all four run at once
        return i * i

    results = [None] * 4

    def call(i: int) -> None:
        results[i] = runner.run(wait_for_all(i))

    # asyncio.Event binds to the loop that first waits on it: the background loop
    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [0, 1, 4, 9] and len(loops) == 1
    runner.close()


def test_errors_come_back_and_close_runs_the_final_coroutine_then_restarts():
    runner = background.BackgroundLoop("test")

    async def fail():
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        runner.run(fail())
    first = runner.run(asyncio.sleep(0, result=threading.current_thread()))
    closed = []

    async def final():
        closed.append(threading.current_thread().name)

    runner.close(final)
    assert closed == ["test-loop"] and first is threading.current_thread()
    runner.close(final)  # already closed: nothing runs
    assert closed == ["test-loop"]
    assert runner.run(asyncio.sleep(0, result=7)) == 7  # a fresh loop
    runner.close()


def test_a_sync_call_from_the_loop_itself_is_refused():
    runner = background.BackgroundLoop("test")

    async def nested():
        return runner.run(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="would wait for itself"):
        runner.run(nested())
    runner.close()
