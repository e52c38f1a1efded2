"""A WatchMemory stream that is opened again when it breaks: what every host loop that
follows an agent reads (the metrics feed, give-back --follow)."""

from __future__ import annotations

import threading
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
