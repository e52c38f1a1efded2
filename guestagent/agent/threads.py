"""Thread pools whose threads end when they have been idle a while.

concurrent.futures keeps every thread it ever started until shutdown: a pool used once at
start-up, or by one burst of calls, left threads idle for the agent's whole life, each with
its stack and its share of malloc's arenas, in every guest.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from guestagent.linux.syscalls import name_thread

# Long enough that a steady trickle of calls keeps its thread, short against a guest's life.
IDLE_EXIT_SECONDS = 30.0

Params = ParamSpec("Params")
Value = TypeVar("Value")
_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class IdleExitPool(ThreadPoolExecutor):
    """Up to max_workers threads, started as work arrives, each ending after idle_seconds
    without work; the last to end calls after_burst (the end of a burst of work is when the
    memory it used can go back). A ThreadPoolExecutor by type (asyncio's default executor must
    be one); its own scheduling replaces the base class's."""

    def __init__(
        self,
        max_workers: int,
        thread_name_prefix: str,
        idle_seconds: float = IDLE_EXIT_SECONDS,
        after_burst: Callable[[], object] = lambda: None,
    ) -> None:
        super().__init__(max_workers, thread_name_prefix)
        self.idle_seconds = idle_seconds
        self.after_burst = after_burst
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        # Held while work is queued and while a thread decides to end, so neither misses the
        # other: a thread ends only when nothing is queued, and then no longer counts.
        self._state = threading.Lock()
        self._queued = 0  # Work put and not yet taken.
        self._waiting = 0  # Threads free to take it.
        self._live: set[threading.Thread] = set()
        self._started = 0
        self._closed = False

    @property
    def live_threads(self) -> int:
        with self._state:
            return len(self._live)

    def submit(
        self, fn: Callable[Params, Value], /, *args: Params.args, **kwargs: Params.kwargs
    ) -> Future[Value]:
        future: Future[Value] = Future()
        with self._state:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._work.put((future, fn, args, kwargs))
            self._queued += 1
            if self._queued > self._waiting and len(self._live) < self._max_workers:
                self._started += 1
                self._waiting += 1
                thread = threading.Thread(
                    target=self._run,
                    name=f"{self._thread_name_prefix}_{self._started}",
                    daemon=True,
                )
                self._live.add(thread)
                thread.start()
        return future

    def _run(self) -> None:
        me = threading.current_thread()
        name_thread(me.name)  # Python 3.11 leaves the process's name on every thread.
        while True:
            try:
                work = self._work.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._state:
                    ending = self._queued == 0  # Else work came as the wait ended: take it.
                    if ending:
                        self._waiting -= 1
                        self._live.discard(me)
                        last = not self._live
                if not ending:
                    continue
                if last:
                    self.after_burst()
                return
            with self._state:
                self._waiting -= 1
                if work is None:  # shutdown()
                    self._live.discard(me)
                    return
                self._queued -= 1
            future, fn, args, kwargs = work
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as error:
                    future.set_exception(error)
            del work, future, fn, args, kwargs  # No result outlives the call while idle.
            with self._state:
                self._waiting += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._state:
            self._closed = True
            threads = list(self._live)
            if cancel_futures:
                while True:
                    try:
                        work = self._work.get_nowait()
                    except queue.Empty:
                        break
                    if work is not None:
                        self._queued -= 1
                        work[0].cancel()
            for _ in threads:
                self._work.put(None)
        if wait:
            for thread in threads:
                thread.join()
