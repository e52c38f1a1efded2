"""How slow a guest is right now, against the same guest on an idle host.

A VM test's deadlines are written for an idle host. On a busy one (other guests, a CPU hog,
two cores shared by many jobs) a TCG guest runs several times slower, and a fixed deadline
becomes a flake. So each guest is timed once after boot on a trivial command, and the tests
scale their deadlines, and those of the clients they run in the guest, by the ratio.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from guestagent.vm.qemu import GuestVM

# What guestctl does before its first call: start an interpreter. Through testexec, so the
# figure includes the host's round trip.
PROBE = ("python3", "-c", "pass")
PROBE_RUNS = 3
# The probe on this 2-core host, guest under TCG, no other guest running: the five guests
# of one run of the VM suite measured medians of 0.124-0.215 s. The fastest is the idle one.
IDLE_PROBE_SECONDS = 0.12
# The same for an aarch64 guest (qemu-system-aarch64 under TCG, docs/arm64.md): the median of
# the quietest of four runs (0.528 s; 0.708, 1.54 and 2.04 s with other jobs busier), so a
# factor of 1 is an aarch64 guest at its best here, not an x86_64 one.
IDLE_PROBE_SECONDS_BY_ARCH = {"x86_64": IDLE_PROBE_SECONDS, "aarch64": 0.5}
# Past this a guest is not slow but stuck; deadlines stop growing so a failure still ends.
MAX_FACTOR = 20.0


@dataclass(frozen=True)
class Pace:
    """factor: how many times slower than idle the guest answers (never below 1)."""

    factor: float
    probe_seconds: float

    def scale(self, idle_seconds: float) -> float:
        return idle_seconds * self.factor


def pace_from(probe_seconds: Sequence[float], idle_seconds: float = IDLE_PROBE_SECONDS) -> Pace:
    """The median run, so one stall of the host does not set the pace of a whole module."""
    median = statistics.median(probe_seconds)
    factor = min(MAX_FACTOR, max(1.0, median / idle_seconds))
    return Pace(factor=round(factor, 2), probe_seconds=round(median, 3))


_paces: weakref.WeakKeyDictionary[GuestVM, Pace] = weakref.WeakKeyDictionary()
MEASURED: list[Pace] = []


def measure(vm: GuestVM) -> Pace:
    """Time the probe in this guest and remember the pace for of()."""
    runs = []
    for _ in range(PROBE_RUNS):
        started = time.monotonic()
        idle = IDLE_PROBE_SECONDS_BY_ARCH[vm.config.arch]
        vm.exec(list(PROBE), timeout=idle * MAX_FACTOR * 4)
        runs.append(time.monotonic() - started)
    pace = _paces[vm] = pace_from(runs, IDLE_PROBE_SECONDS_BY_ARCH[vm.config.arch])
    MEASURED.append(pace)
    return pace


def of(vm: GuestVM) -> Pace:
    """The guest's pace, measured on first use (boot() measures it right away)."""
    return _paces.get(vm) or measure(vm)


class Deadline:
    """A test's time budget; each client started in the guest gets what is left of it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def passed(self) -> bool:
        return time.monotonic() >= self.end
