"""Which report work runs now: a few at a time, none while a state-changing call runs.

Two hundred callers asking for reports kept the guest's one CPU busy, and a SetMemoryLimits,
which a runtime makes for every container it starts, waited behind them: gRPC takes calls up
one at a time, in the order they came, on the event loop's thread (grpcio's aio server), and
every report read, built and encoded took its share of that thread and of the CPU
(docs/measurements.md, Load). A report (a GetMemoryInfo, or a stream's message) takes a slot
here before it reads and gives it back once encoded; calls beyond the slots wait, parked,
costing the loop nothing, in the order they came. While a state-changing call runs no report
starts for up to HOLD_S, so its thread has the CPU (and the GIL) to itself but for reports
already under way; one slot gave it a share only, and natively its p99 under 100 readers was
still 15-20x its p99 alone (docs/measurements.md, issue 56). Past HOLD_S of changes (a long
Reclaim or Compact, or changes back to back) one slot is given, so reports and streams go on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

# How long state-changing calls hold every report back before one is let through: a
# SetMemoryLimits takes a few milliseconds, and a report may be up to the share window old.
HOLD_S = 0.05


class ReportAdmission:
    def __init__(self, slots: int, hold_s: float = HOLD_S) -> None:
        self.slots = slots
        self.hold_s = hold_s
        self._running = 0
        self._changing = 0  # State-changing calls under way.
        # Reports held back: from when changes began until hold_s later, or they all end.
        self._hold: asyncio.TimerHandle | None = None
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def open_slots(self) -> int:
        allowed = (0 if self._hold is not None else 1) if self._changing else self.slots
        return max(0, allowed - self._running)

    @contextlib.asynccontextmanager
    async def report(self) -> AsyncIterator[None]:
        """A slot for one report's work, waited for in turn."""
        if self._waiting or not self.open_slots:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._running -= 1  # Given a slot as it was cancelled: give it back.
                    self._wake()
                elif waiter in self._waiting:  # A release's wake-up may have dropped it.
                    self._waiting.remove(waiter)
                raise
        else:
            self._running += 1
        try:
            yield
        finally:
            self._running -= 1
            self._wake()

    @contextlib.asynccontextmanager
    async def change(self) -> AsyncIterator[None]:
        """A state-changing call under way: no report starts until it ends or hold_s of
        changes pass, then one at a time."""
        self._changing += 1
        if self._changing == 1:
            self._hold = asyncio.get_running_loop().call_later(self.hold_s, self._end_hold)
        try:
            yield
        finally:
            self._changing -= 1
            if not self._changing:
                self._end_hold()
            else:
                self._wake()

    def _end_hold(self) -> None:
        if self._hold is not None:
            self._hold.cancel()
            self._hold = None
        self._wake()

    def _wake(self) -> None:
        while self._waiting and self.open_slots:
            waiter = self._waiting.popleft()
            if not waiter.done():
                self._running += 1
                waiter.set_result(None)
