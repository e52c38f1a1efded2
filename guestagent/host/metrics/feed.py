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

from guestagent.host.client import AgentClient, WatchStream
from guestagent.host.metrics.families import Snapshot
from guestagent.host.streams import Reopening, quiet_limit
from guestagent.v1 import agent_pb2 as pb


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
