"""Follow an agent's WatchMemory stream on a thread and keep the latest report.

One stream serves every scrape, so a scrape costs the guest nothing and sees reports the
kernel pushed (memory.events, PSI) between intervals. When the stream breaks (agent
restarted, VM paused, connection lost) the feed opens it again after a growing delay.
A stream that stays open but has been quiet for several intervals when a scrape comes is
taken as broken too: cancelled and opened again.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import grpc

from guestagent.host.client import AgentClient, WatchStream, describe_error
from guestagent.host.metrics import Snapshot
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
        self, watch: Callable[[], WatchStream], broken: Callable[[str, float], None]
    ) -> None:
        self._watch, self._broken = watch, broken
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._stream: WatchStream | None = None

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
                self._stream = stream
            # stop() may have run before the stream was held, and found nothing to cancel.
            if self.stopping.is_set():
                stream.cancel()
            try:
                for report in stream:
                    attempt = 0
                    yield report
                error = "the agent ended the stream"
            except grpc.RpcError as e:
                error = describe_error(e)
            with self._lock:
                self._stream = None
            if self.stopping.is_set():
                return
            delay = backoff_delay(attempt)
            self._broken(error, delay)
            if self.stopping.wait(delay):
                return
            attempt += 1


class WatchFeed:
    def __init__(
        self,
        client: AgentClient,
        cgroups: Sequence[str] = (),
        interval_ms: int = 0,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    ) -> None:
        self._client = client
        self._cgroups = list(cgroups)
        self._interval_ms = interval_ms
        self._quiet_limit = quiet_limit(interval_ms)
        self._clock = clock
        self._log = log
        self._lock = threading.Lock()
        self._reports = Reopening(self._open, self._broken)
        self._thread = threading.Thread(target=self._run, name="watch-feed", daemon=True)
        self._last_error = ""
        self._report: pb.MemoryInfo | None = None
        self._received_at = 0.0
        self._connected = False
        self._opened = 0

    def start(self) -> WatchFeed:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._reports.stop()
        self._thread.join(timeout)

    def snapshot(self) -> Snapshot:
        with self._lock:
            age = self._clock() - self._received_at if self._report is not None else None
            quiet = self._connected and age is not None and age > self._quiet_limit
            snapshot = Snapshot(
                report=self._report,
                up=self._connected and not quiet,
                report_age_seconds=age,
                reconnects=max(0, self._opened - 1),
            )
        if quiet:
            self._reports.cancel()  # the stream loop sees CANCELLED and opens a new one
        return snapshot

    def _run(self) -> None:
        for report in self._reports:
            with self._lock:
                self._report, self._received_at = report, self._clock()
                self._connected = True
            if self._last_error:
                self._log(f"guestctl: metrics: stream from {self._client.target} is back")
                self._last_error = ""
        with self._lock:
            self._connected = False

    def _open(self) -> WatchStream:
        with self._lock:
            self._opened += 1
        return self._client.watch(self._cgroups, self._interval_ms)

    def _broken(self, error: str, delay: float) -> None:
        with self._lock:
            self._connected = False
        if error != self._last_error:
            self._log(
                f"guestctl: metrics: stream from {self._client.target}: {error}; "
                f"retrying in {delay:.1f} s"
            )
        self._last_error = error
