"""A WatchMemory stream that is opened again when it breaks, and a watchdog that breaks one
gone quiet: what every host loop that follows an agent reads (the metrics feed,
give-back --follow, the node daemon's loops)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import grpc

from guestagent.host.client import WatchStream, describe_error
from guestagent.v1 import agent_pb2 as pb

AGENT_DEFAULT_INTERVAL_MS = 1000  # what the agent uses when the request says 0
QUIET_INTERVALS = 3
MIN_QUIET_SECONDS = 5.0


def backoff_delay(attempt: int, first: float = 0.1, cap: float = 10.0) -> float:
    """Seconds to wait before reconnect attempt `attempt` (0-based): doubling, capped."""
    return min(cap, first * 2.0 ** min(attempt, 32))


def quiet_limit(interval_ms: int) -> float:
    """How long an open stream may go without a message before it is taken as broken."""
    interval = (interval_ms or AGENT_DEFAULT_INTERVAL_MS) / 1000
    return max(QUIET_INTERVALS * interval, MIN_QUIET_SECONDS)


class Reopening:
    """The reports of `watch`'s streams until stop(): a stream that breaks is said to `broken`
    (why, and the delay) and opened again after a growing delay."""

    def __init__(
        self,
        watch: Callable[[], WatchStream],
        broken: Callable[[str, float], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._watch, self._broken, self._clock = watch, broken, clock
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._stream: WatchStream | None = None
        # When the stream in hand was opened or last delivered; None while none is open.
        self.heard_at: float | None = None
        self._quiet = False

    def quiet_for(self, now: float) -> float:
        """How long the open stream has said nothing (0 while none is open)."""
        with self._lock:
            return 0.0 if self.heard_at is None else now - self.heard_at

    def cancel_quiet(self) -> None:
        """End the stream in hand as gone quiet: the loop says so and opens a new one."""
        with self._lock:
            self._quiet = True
        self.cancel()

    def stop(self) -> None:
        self.stopping.set()
        self.cancel()

    def cancel(self) -> None:
        """End the stream in hand; as a broken one, it is opened again."""
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()

    def __iter__(self) -> Iterator[pb.MemoryInfo]:
        attempt = 0
        while not self.stopping.is_set():
            stream = self._watch()
            with self._lock:
                self._stream, self.heard_at, self._quiet = stream, self._clock(), False
            # stop() may have run before the stream was held, and found nothing to cancel.
            if self.stopping.is_set():
                stream.cancel()
            try:
                for report in stream:
                    attempt = 0
                    with self._lock:
                        self.heard_at = self._clock()
                    yield report
                error = "the agent ended the stream"
            except grpc.RpcError as e:
                error = describe_error(e)
            with self._lock:
                self._stream, self.heard_at = None, None
                if self._quiet:
                    error = "the stream went quiet"
            if self.stopping.is_set():
                return
            delay = backoff_delay(attempt)
            self._broken(error, delay)
            if self.stopping.wait(delay):
                return
            attempt += 1


class Watchdog:
    """One thread for every followed stream: a stream quiet for longer than its limit is
    cancelled, so the loop reading it gets control back (a grpc stream's next message has no
    deadline of its own) and opens it again. One for a node's tens of streams, not a thread
    each."""

    def __init__(self, period: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._period, self._clock = period, clock
        self._guarded: dict[Reopening, float] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
        self._thread.start()

    def guard(self, reports: Reopening, limit: float) -> None:
        with self._lock:
            self._guarded[reports] = limit

    def forget(self, reports: Reopening) -> None:
        with self._lock:
            self._guarded.pop(reports, None)

    def check(self) -> None:
        """One round: cancel each stream past its limit."""
        now = self._clock()
        with self._lock:
            quiet = [r for r, limit in self._guarded.items() if r.quiet_for(now) > limit]
        for reports in quiet:
            reports.cancel_quiet()

    def _run(self) -> None:
        while not self._stopping.wait(self._period):
            self.check()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)
