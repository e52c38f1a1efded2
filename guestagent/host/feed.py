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
from collections.abc import Callable, Sequence

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
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watch-feed", daemon=True)
        self._stream: WatchStream | None = None
        self._report: pb.MemoryInfo | None = None
        self._received_at = 0.0
        self._connected = False
        self._reconnects = 0

    def start(self) -> WatchFeed:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._cancel()
        self._thread.join(timeout)

    def snapshot(self) -> Snapshot:
        with self._lock:
            age = self._clock() - self._received_at if self._report is not None else None
            quiet = self._connected and age is not None and age > self._quiet_limit
            snapshot = Snapshot(
                report=self._report,
                up=self._connected and not quiet,
                report_age_seconds=age,
                reconnects=self._reconnects,
            )
        if quiet:
            self._cancel()  # the stream loop sees CANCELLED and opens a new one
        return snapshot

    def _cancel(self) -> None:
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()

    def _run(self) -> None:
        attempt = 0
        last_error = ""
        while True:
            stream = self._client.watch(self._cgroups, self._interval_ms)
            with self._lock:
                self._stream = stream
            # stop() may have run before the stream was stored, and found nothing to cancel.
            if self._stopping.is_set():
                stream.cancel()
            try:
                for report in stream:
                    with self._lock:
                        self._report, self._received_at = report, self._clock()
                        self._connected = True
                    if attempt:
                        self._log(f"guestctl: metrics: stream from {self._client.target} is back")
                    attempt, last_error = 0, ""
                error = "the agent ended the stream"
            except grpc.RpcError as e:
                error = describe_error(e)
            with self._lock:
                self._stream = None
                self._connected = False
            delay = backoff_delay(attempt)
            if not self._stopping.is_set() and error != last_error:
                self._log(
                    f"guestctl: metrics: stream from {self._client.target}: {error}; "
                    f"retrying in {delay:.1f} s"
                )
            last_error = error
            if self._stopping.wait(delay):
                return
            attempt += 1
            with self._lock:
                self._reconnects += 1
