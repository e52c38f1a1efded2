"""`give-back --follow --metrics`: what the loop asks and sees, one series per device. The
follow loop's only tie to prometheus_client (the `host` extra), imported when --metrics is
given."""

from __future__ import annotations

import math
from typing import Any

from prometheus_client import Counter, Gauge
from prometheus_client.registry import CollectorRegistry

from guestagent.host.giveback.follow import Change, Reading


class FollowMetrics:
    """The gauges and the changes counter of one follow loop, in a registry of their own."""

    def __init__(self, vmm: str, device: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = ("vmm", "device")
        values = (vmm, device)
        self._values = values

        def gauge(name: str, help: str) -> Any:
            return Gauge(name, help, labels, registry=self.registry).labels(*values)

        self.taken = gauge(
            "guestctl_giveback_follow_taken_bytes", "What the device holds of the guest's memory"
        )
        self.asked = gauge(
            "guestctl_giveback_follow_asked_bytes", "What the device is asked to hold"
        )
        self.safe = gauge(
            "guestctl_giveback_follow_safe_bytes",
            "The most the device may hold by the agent's figure (NaN without one)",
        )
        self.stall = gauge(
            "guestctl_giveback_follow_stall_ratio",
            "Share of the last interval some task stalled on memory (NaN without two samples)",
        )
        self.changes = Counter(
            "guestctl_giveback_follow_changes",
            "Requests to the VMM, by direction and cause",
            (*labels, "direction", "cause"),
            registry=self.registry,
        )

    def observe(self, reading: Reading, asked: int, stall: float | None) -> None:
        self.taken.set(reading.taken)
        self.asked.set(asked)
        self.safe.set(math.nan if reading.safe is None else reading.safe)
        self.stall.set(math.nan if stall is None else stall)

    def changed(self, change: Change, direction: str) -> None:
        self.changes.labels(*self._values, direction, change.cause).inc()
