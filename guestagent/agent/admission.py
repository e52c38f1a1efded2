"""Which report work runs now: a few at a time, fewer while a state-changing call runs.

Two hundred callers asking for reports kept the guest's one CPU busy, and a SetMemoryLimits,
which a runtime makes for every container it starts, waited behind them: gRPC takes calls up
one at a time, in the order they came, on the event loop's thread (grpcio's aio server), and
every report read, built and encoded took its share of that thread and of the CPU
(docs/measurements.md, Load). A report (a GetMemoryInfo, or a stream's message) takes a slot
here before it reads and gives it back once encoded; calls beyond the slots wait, parked,
costing the loop nothing, in the order they came. While a state-changing call runs, one slot
only is given, so its thread has the CPU to itself but for one report.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator


class ReportAdmission:
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._running = 0
        self._changing = 0  # State-changing calls under way.
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def open_slots(self) -> int:
        allowed = 1 if self._changing else self.slots
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
        """A state-changing call under way: reports get one slot until it ends."""
        self._changing += 1
        try:
            yield
        finally:
            self._changing -= 1
            self._wake()

    def _wake(self) -> None:
        while self._waiting and self.open_slots:
            waiter = self._waiting.popleft()
            if not waiter.done():
                self._running += 1
                waiter.set_result(None)
