"""Readings shared by every caller that asks at about the same time (a single flight).

Two hundred hosts' calls asking for the guest's memory at once each read the same kernel
files: under TCG 17 reports a second took the guest's one CPU, and a SetMemoryLimits waited
seconds behind them (docs/measurements.md, Load). Here each caller says how fresh a reading it
takes, as the monotonic time a reading must have started at or after; a caller takes the last
reading if it qualifies, else waits for one under way that does, else reads, and callers that
come while it reads wait for it. A failed read is raised to each caller that waited on it and
kept for none.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")


class _Flight(Generic[Value]):
    """One read: when it started, and its outcome once it ends."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.ended = threading.Event()
        self.value: Value | None = None
        self.error: BaseException | None = None

    def outcome(self) -> Value:
        self.ended.wait()
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]  # Set before ended, when no error.


class SharedReads(Generic[Key, Value]):
    """read(key) at most once at a time per key, its result shared as above. Readings that
    started more than keep_s ago are dropped (a caller asking for one that old would be
    answered from it; none of the agent's asks that far back)."""

    def __init__(
        self,
        read: Callable[[Key], Value],
        keep_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._keep_s = keep_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[Key, _Flight[Value]] = {}  # The latest read that ended well.
        self._flying: dict[Key, _Flight[Value]] = {}
        self._swept_at = clock()

    def get(self, key: Key, fresh_from: float) -> Value:
        """A reading of key that started at or after fresh_from (clock's time)."""
        with self._lock:
            last = self._last.get(key)
            if last is not None and last.started >= fresh_from:
                return last.outcome()
            flying = self._flying.get(key)
            if flying is not None and flying.started >= fresh_from:
                mine = None
            else:
                flying = mine = _Flight[Value](self._clock())
                self._flying[key] = mine
        if mine is None:
            return flying.outcome()
        try:
            value = mine.value = self._read(key)
        except BaseException as error:
            mine.error = error
            raise
        else:
            with self._lock:
                last = self._last.get(key)
                if last is None or last.started < mine.started:
                    self._last[key] = mine
                self._sweep(mine.started)
        finally:
            with self._lock:
                if self._flying.get(key) is mine:
                    del self._flying[key]
            mine.ended.set()
        return value

    def _sweep(self, now: float) -> None:
        """Drop readings past keep_s, at most once per keep_s: a guest's cgroups come and go."""
        if now - self._swept_at < self._keep_s:
            return
        self._swept_at = now
        for key in [k for k, v in self._last.items() if now - v.started > self._keep_s]:
            del self._last[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._last)
