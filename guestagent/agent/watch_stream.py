"""The WatchMemory stream: a report at once, then on every kernel signal or interval.

Kept apart from the servicer so the loop (coalescing, the reason for each message, the end
on shutdown) is plain asyncio over domain values; wire.py turns each update into protobuf.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from guestagent import errors
from guestagent.linux.cgroups import cgroup_dir
from guestagent.linux.features import Absent, read_psi_absence
from guestagent.linux.fs import KernelFS
from guestagent.linux.memblocks import HotplugReportCache
from guestagent.linux.meminfo import MemoryReport, read_report
from guestagent.linux.watch import KernelSignals, PressureTriggerSpec, Signal, SignalHub
from guestagent.ops.giveback import IdleReport
from guestagent.ops.idle import IdleSpec
from guestagent.ops.workingset.reclaimer import TargetStatus

DEFAULT_WATCH_INTERVAL_MS = 1000
MIN_WATCH_INTERVAL_MS = 100
# Signals that arrive within this long of each other are sent as one message.
COALESCE_SECONDS = 0.01
# A stream's cost: the cgroups it reads each second at its interval (the system report counts
# as one). 10,000 cgroups every 100 ms stalled every other call for seconds.
MAX_CGROUP_READS_PER_SECOND = 1024


class WatchReason(enum.Enum):
    INITIAL = "initial"
    INTERVAL = "interval"
    MEMORY_EVENTS = "memory_events"
    PRESSURE = "pressure"


@dataclass(frozen=True)
class WatchSpec:
    cgroups: tuple[str, ...] = ()
    interval_s: float = DEFAULT_WATCH_INTERVAL_MS / 1000
    trigger: PressureTriggerSpec = field(default_factory=PressureTriggerSpec)
    trigger_asked: bool = False  # The caller set pressure_trigger (else it is the default).
    idle: IdleSpec = field(default_factory=IdleSpec)


@dataclass(frozen=True)
class WatchUpdate:
    report: MemoryReport
    reason: WatchReason
    changed: tuple[str, ...] = ()  # Cgroups whose memory.events changed.
    reclaim: tuple[TargetStatus, ...] = ()  # The reclaimer's, for the watched cgroups it acts on.
    idle: IdleReport | None = None  # None when the stream reads no idle figures (a test's).


def watch_interval_seconds(interval_ms: int) -> float:
    """The interval asked for, 0 meaning the default; below the minimum is refused."""
    if interval_ms == 0:
        return DEFAULT_WATCH_INTERVAL_MS / 1000
    if interval_ms < MIN_WATCH_INTERVAL_MS:
        raise errors.InvalidArgument(
            f"watch interval {interval_ms} ms is below the minimum {MIN_WATCH_INTERVAL_MS} ms",
            "WATCH_INTERVAL_TOO_SHORT",
            field="interval_ms",
            metadata={"minimumMs": MIN_WATCH_INTERVAL_MS},
        )
    return interval_ms / 1000


def trigger_to_arm(spec: WatchSpec, psi: Absent | None) -> PressureTriggerSpec | None:
    """The trigger to arm: none without PSI, and a trigger asked for without PSI is refused
    (the caller would wait for signals that never come)."""
    if psi is None:
        return spec.trigger
    if spec.trigger_asked:
        raise errors.FailedPrecondition(
            f"pressure_trigger set, but there is no PSI: {psi.reason}",
            "STALL_SIGNAL_ABSENT",
            metadata={"feature": psi.feature},
        )
    return None


def watch_spec(
    cgroups: tuple[str, ...],
    interval_ms: int,
    trigger: PressureTriggerSpec,
    trigger_asked: bool = False,
    idle: IdleSpec | None = None,
) -> WatchSpec:
    """A stream's spec, refused when it would read more cgroups a second than the bound."""
    interval_s = watch_interval_seconds(interval_ms)
    reads = (len(cgroups) or 1) / interval_s
    if reads > MAX_CGROUP_READS_PER_SECOND:
        raise errors.InvalidArgument(
            f"{len(cgroups)} cgroups every {interval_s * 1000:.0f} ms is {reads:.0f} cgroup "
            f"reads per second, over the bound of {MAX_CGROUP_READS_PER_SECOND}: watch fewer, "
            "or less often",
            "WATCH_TOO_MANY_CGROUPS",
            field="cgroups",
            metadata={"readsPerSecond": MAX_CGROUP_READS_PER_SECOND},
        )
    return WatchSpec(cgroups, interval_s, trigger, trigger_asked, idle or IdleSpec())


def reason_for(woke: Iterable[tuple[Signal, str | None]]) -> tuple[WatchReason, tuple[str, ...]]:
    """Why a message goes out: changed cgroups win over pressure, and nothing is the interval."""
    signals = list(woke)
    changed = tuple(sorted({name for _, name in signals if name is not None}))
    if changed:
        return WatchReason.MEMORY_EVENTS, changed
    if signals:
        return WatchReason.PRESSURE, ()
    return WatchReason.INTERVAL, ()


# A report of the given cgroups; after the first, one that does not exist is listed as removed.
ReadReport = Callable[[tuple[str, ...], bool], Awaitable[MemoryReport]]
# A report's idle histograms and give-back figures, read off the event loop's thread.
ReadIdle = Callable[[MemoryReport, IdleSpec], Awaitable[IdleReport]]


async def watch_memory(
    fs: KernelFS,
    spec: WatchSpec,
    stopping: asyncio.Event,
    reclaim_status: Callable[[tuple[str, ...]], tuple[TargetStatus, ...]] = lambda names: (),
    hotplug: HotplugReportCache | None = None,
    hub: SignalHub | None = None,
    read: ReadReport | None = None,
    idle: ReadIdle | None = None,
) -> AsyncIterator[WatchUpdate]:
    """Updates until `stopping` is set or the caller stops iterating (which frees its share
    of the hub's inotify watches and PSI trigger). `read` reads a report off the event loop's
    thread (the servicer's reader threads); None reads it in place. `idle` adds each
    report's idle figures; None leaves them out."""
    hub = hub or SignalHub(fs)

    async def report(removed_ok: bool = True) -> MemoryReport:
        if read is None:
            return read_report(fs, spec.cgroups, hotplug, removed_ok)
        return await read(spec.cgroups, removed_ok)

    async def figures(report: MemoryReport) -> IdleReport | None:
        return await idle(report, spec.idle) if idle is not None else None

    # Checks every name before anything is armed: a cgroup missing at the start is NOT_FOUND.
    first = await report(removed_ok=False)
    events = {name: cgroup_dir(fs, name) / "memory.events" for name in spec.cgroups}
    trigger = trigger_to_arm(spec, read_psi_absence(fs))
    with hub.subscribe(events, trigger) as signals:
        yield WatchUpdate(
            first, WatchReason.INITIAL, (), reclaim_status(spec.cgroups), await figures(first)
        )
        while True:
            woke = await _next_signals(signals, spec.interval_s, stopping)
            if woke is None:
                return
            reason, changed = reason_for(woke)
            now = await report()
            follow_cgroups(fs, signals, now.removed)
            yield WatchUpdate(
                now, reason, changed, reclaim_status(spec.cgroups), await figures(now)
            )


def follow_cgroups(fs: KernelFS, signals: KernelSignals, removed: tuple[str, ...]) -> None:
    """Keep a stream's watches on its cgroups as they come and go: a removed one loses its
    watch, and one created again under its name is watched again."""
    signals.hub.forget(signals, removed)
    for name in signals.unwatched():
        if name not in removed:
            with contextlib.suppress(errors.NotFound):  # Gone again meanwhile.
                signals.hub.watch(signals, name, cgroup_dir(fs, name) / "memory.events")


async def _next_signals(
    signals: KernelSignals, interval_s: float, stopping: asyncio.Event
) -> list[tuple[Signal, str | None]] | None:
    """Kernel signals (coalesced), [] when the interval passed first, None on shutdown."""
    getter = asyncio.ensure_future(signals.queue.get())
    stopper = asyncio.ensure_future(stopping.wait())
    try:
        done, _ = await asyncio.wait(
            {getter, stopper}, timeout=interval_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        getter.cancel()
        stopper.cancel()
    if stopper in done:
        return None
    if getter not in done:
        return []
    woke = [getter.result()]
    await asyncio.sleep(COALESCE_SECONDS)
    while not signals.queue.empty():
        woke.append(signals.queue.get_nowait())
    return woke
