"""An asyncio event loop on its own thread: how the library's sync methods run their async twins.

Each async method holds the one implementation; its sync twin is `return self._background.run(self.amethod(...))`.
Sync callers on any number of threads become concurrent tasks on the one loop, so whatever a loop owns (an
`httpx.AsyncClient`, a concurrency semaphore) is shared by all of them, and per-call timeouts are the async
code's own.

    background = BackgroundLoop("ChatClient")
    result = background.run(client.acomplete(messages))   # blocks this thread until the coroutine is done
    background.close(client.aclose)                       # closes what lives on the loop, then stops it
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """An event loop on a daemon thread, started on first use and stopped by `close` (or when collected).

    Args:
        name: names the loop's thread (`<name>-loop`), for debuggers and thread dumps.
    """

    def __init__(self, name: str):
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: weakref.finalize | None = None

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name=f"{self.name}-loop", daemon=True)
                self._thread.start()
                self._stop = weakref.finalize(self, self._loop.call_soon_threadsafe, self._loop.stop)
            return self._loop

    def _refuse_own_thread(self, what: str) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError(f"{what} of {self.name} called from a coroutine on its own background loop "
                               "would wait for itself; await the async twin instead")

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs `coro` on the loop and blocks until it is done; returns its result or raises its exception.

        If the waiting thread is interrupted (KeyboardInterrupt), the coroutine is cancelled.

        Raises:
            RuntimeError: called from the loop's own thread (it would wait for itself).
        """
        loop = self._running_loop()
        try:
            self._refuse_own_thread("a sync method")
        except RuntimeError:
            coro.close()
            raise
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def close(self, final: Callable[[], Awaitable[None]] | None = None) -> None:
        """Runs `final()` on the loop (to close what lives there), then stops the loop and joins its thread.

        Does nothing when the loop never started or is already closed; a later `run` starts a fresh loop.
        The loop stops even if `final` raises (its exception comes back).
        """
        self._refuse_own_thread("close")
        with self._lock:
            loop, thread, stop = self._loop, self._thread, self._stop
            self._loop = self._thread = self._stop = None
        if loop is None:
            return
        stop.detach()
        try:
            if final is not None:
                asyncio.run_coroutine_threadsafe(final(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
