"""`give-back --follow --metrics`: what the loop asks and sees, one series per device, as
families for metrics/server.py to serve."""

from __future__ import annotations

import math
import threading

from guestagent.host.giveback.follow import Change, Reading
from guestagent.host.metrics.families import Family, Sample

LABELS = ("vmm", "device")


class FollowMetrics:
    """The loop's last observation and its changes, by direction and cause."""

    def __init__(self, vmm: str, device: str) -> None:
        self._values = (vmm, device)
        self._lock = threading.Lock()
        self._last: tuple[float, float, float, float] | None = None  # taken, asked, safe, stall
        self._changes: dict[tuple[str, str], int] = {}

    def observe(self, reading: Reading, asked: int, stall: float | None) -> None:
        safe = math.nan if reading.safe is None else float(reading.safe)
        with self._lock:
            self._last = (
                float(reading.taken),
                float(asked),
                safe,
                math.nan if stall is None else stall,
            )

    def changed(self, change: Change, direction: str) -> None:
        with self._lock:
            key = (direction, change.cause)
            self._changes[key] = self._changes.get(key, 0) + 1

    def families(self) -> list[Family]:
        with self._lock:
            last, changes = self._last, dict(self._changes)

        def gauge(name: str, help_: str, index: int) -> Family:
            samples = () if last is None else (Sample(self._values, last[index]),)
            return Family(name, "gauge", help_, LABELS, samples)

        return [
            gauge(
                "guestctl_giveback_follow_taken_bytes",
                "What the device holds of the guest's memory",
                0,
            ),
            gauge("guestctl_giveback_follow_asked_bytes", "What the device is asked to hold", 1),
            gauge(
                "guestctl_giveback_follow_safe_bytes",
                "The most the device may hold by the agent's figure (NaN without one)",
                2,
            ),
            gauge(
                "guestctl_giveback_follow_stall_ratio",
                "Share of the last interval some task stalled on memory (NaN without two samples)",
                3,
            ),
            Family(
                "guestctl_giveback_follow_changes_total",
                "counter",
                "Requests to the VMM, by direction and cause",
                (*LABELS, "direction", "cause"),
                tuple(
                    Sample((*self._values, direction, cause), float(count))
                    for (direction, cause), count in sorted(changes.items())
                ),
            ),
        ]
