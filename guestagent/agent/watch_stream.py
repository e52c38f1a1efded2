"""The WatchMemory stream: a report at once, then on every kernel signal or interval.

Kept apart from the servicer so the loop (coalescing, the reason for each message, the end
on shutdown) is plain asyncio over domain values; wire.py turns each update into protobuf.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import field

from guestagent import errors
from guestagent.jsonlog import EventLog, Repeats
from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.delayacct import DelayStallMeter, StallWindow
from guestagent.linux.features import DELAYACCT, Absent, read_psi_absence
from guestagent.linux.kernel import Kernel
from guestagent.linux.watch import KernelSignals, PressureTriggerSpec, Signal, SignalHub
from guestagent.ops.idle import IdleSpec
from guestagent.ops.info import InfoSpec, Report, Reporter
from guestagent.records import record

log = EventLog("guestagent.watch")
repeats = Repeats(log)

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


@record
class WatchSpec:
    cgroups: tuple[CgroupName, ...] = ()
    interval_s: float = DEFAULT_WATCH_INTERVAL_MS / 1000
    trigger: PressureTriggerSpec = field(default_factory=PressureTriggerSpec)
    trigger_asked: bool = False  # The caller set pressure_trigger (else it is the default).
    idle: IdleSpec = field(default_factory=IdleSpec)

    @property
    def info(self) -> InfoSpec:
        """What each message reports: GetMemoryInfo's answer for the same request."""
        return InfoSpec(self.cgroups, self.idle)


@record
class WatchUpdate:
    answer: Report  # As GetMemoryInfo's (ops/info.py), read afresh for each message.
    reason: WatchReason
    changed: tuple[str, ...] = ()  # Cgroups whose memory.events changed.


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


# A delay-accounting trigger is polled this many times per window.
POLLS_PER_WINDOW = 4


@record
class Triggers:
    """What a stream arms: a PSI trigger, or the same rule polled over delay accounting."""

    psi: PressureTriggerSpec | None = None
    delayacct: PressureTriggerSpec | None = None


def triggers_to_arm(spec: WatchSpec, psi: Absent | None, delay: Absent | None) -> Triggers:
    """PSI's trigger where the kernel has PSI. Without it, the default trigger is left off
    (the interval and memory.events still wake the stream) and one the caller asked for is
    served by polling delay accounting; with neither, or asked for `full` (all tasks stalled,
    which only PSI knows), it is refused: the caller would wait for signals that never come."""
    if psi is None:
        return Triggers(psi=spec.trigger)
    if not spec.trigger_asked:
        return Triggers()
    if spec.trigger.full:
        raise errors.FailedPrecondition(
            f"pressure_trigger asks for full stalls, which only PSI measures: {psi.reason}",
            "FULL_STALL_NEEDS_PSI",
            metadata={"feature": psi.feature},
        )
    if delay is not None:
        raise errors.FailedPrecondition(
            f"pressure_trigger set, but there is no stall signal: no PSI: {psi.reason}; "
            f"no delay accounting: {delay.reason}",
            "STALL_SIGNAL_ABSENT",
            metadata={"features": f"{psi.feature},{delay.feature}"},
        )
    return Triggers(delayacct=spec.trigger)


def watch_spec(
    cgroups: tuple[CgroupName, ...],
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


# The report for a spec; after the first, a cgroup that does not exist is listed as removed.
# The float: the monotonic time its readings must have started at or after (None: as a call
# that comes now, ops/info.py's fresh_from).
ReadReport = Callable[[InfoSpec, bool, float | None], Awaitable[Report]]


def next_tick(after: float, interval_s: float) -> float:
    """The first multiple of the interval on the monotonic clock later than `after`: streams
    with the same interval tick together and share one reading of the kernel's files
    (ops/info.py)."""
    tick = (math.floor(after / interval_s) + 1) * interval_s
    return tick if tick > after else tick + interval_s


async def watch_memory(
    kernel: Kernel,
    spec: WatchSpec,
    stopping: asyncio.Event,
    read: ReadReport | None = None,
    hub: SignalHub | None = None,
    stall: DelayStallMeter | None = None,
) -> AsyncIterator[WatchUpdate]:
    """Updates until `stopping` is set or the caller stops iterating (which frees its share
    of the hub's inotify watches and PSI trigger). `read` reads the report GetMemoryInfo
    answers, off the event loop's thread (the servicer's reader threads); None reads a bare
    report in place. `stall` is delay accounting's meter, which serves a trigger asked for
    where there is no PSI."""
    hub = hub or SignalHub(kernel)
    in_place = Reporter(kernel, stall=stall)  # One hotplug cache for the stream's reports.

    async def report(fresh_from: float | None, removed_ok: bool = True) -> Report:
        if read is None:
            return in_place.report(spec.info, removed_ok, fresh_from)
        return await read(spec.info, removed_ok, fresh_from)

    # Checks every name before anything is armed: a cgroup missing at the start is NOT_FOUND.
    first = await report(None, removed_ok=False)
    events = {name: kernel.cgroup(name).events_file for name in spec.cgroups}
    psi = read_psi_absence(kernel)
    delay = None
    if psi is not None and spec.trigger_asked:
        delay = (
            await asyncio.to_thread(stall.absence)
            if stall is not None
            else Absent(DELAYACCT, "this agent reads no delay accounting")
        )
    triggers = triggers_to_arm(spec, psi, delay)
    with hub.subscribe(events, triggers.psi) as signals:
        poller = None
        if triggers.delayacct is not None and stall is not None:
            poller = asyncio.ensure_future(
                _poll_delay_stall(stall, kernel, triggers.delayacct, signals)
            )
        try:
            yield WatchUpdate(first, WatchReason.INITIAL)
            tick = next_tick(time.monotonic(), spec.interval_s)
            while True:
                woke = await _next_signals(signals, tick, stopping)
                if woke is None:
                    return
                reason, changed = reason_for(woke)
                # A signal's report is read after it; an interval's may be one that started
                # at its tick, which every stream of that interval shares.
                woke_at = time.monotonic()
                now = await report(woke_at if woke else tick)
                # After a signal's message the tick still comes, unless it has passed; after
                # the tick's own, the next (a timer can fire a hair early: never the same).
                if not woke or woke_at >= tick:
                    tick = next_tick(max(woke_at, tick), spec.interval_s)
                follow_cgroups(kernel, signals, now.report.removed)
                yield WatchUpdate(now, reason, changed)
        finally:
            if poller is not None:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller


async def _poll_delay_stall(
    stall: DelayStallMeter, kernel: Kernel, trigger: PressureTriggerSpec, signals: KernelSignals
) -> None:
    """The guest's stall from delay accounting, polled through the trigger's window; a
    PRESSURE signal whenever the trigger's rule fires (StallWindow)."""
    window = StallWindow(trigger.stall_us, trigger.window_us)
    period_s = trigger.window_us / POLLS_PER_WINDOW / 1_000_000
    while True:
        try:
            total = await asyncio.to_thread(stall.guest_total_us)
        except errors.AgentError as e:
            # The stream goes on with its interval and memory.events; the next poll may work.
            repeats.warning("delay_stall_unread", error=str(e))
        else:
            if window.add(time.monotonic_ns() // 1000, total):
                signals.queue.put_nowait((Signal.PRESSURE, None))
        await asyncio.sleep(period_s)


def follow_cgroups(kernel: Kernel, signals: KernelSignals, removed: tuple[str, ...]) -> None:
    """Keep a stream's watches on its cgroups as they come and go: a removed one loses its
    watch, and one created again under its name is watched again."""
    signals.hub.forget(signals, removed)
    for name in signals.unwatched():
        if name not in removed:
            with contextlib.suppress(errors.NotFound):  # Gone again meanwhile.
                signals.hub.watch(signals, name, kernel.cgroup(name).events_file)


async def _next_signals(
    signals: KernelSignals, tick: float, stopping: asyncio.Event
) -> list[tuple[Signal, str | None]] | None:
    """Kernel signals (coalesced), [] when the tick (monotonic) came first, None on shutdown."""
    getter = asyncio.ensure_future(signals.queue.get())
    stopper = asyncio.ensure_future(stopping.wait())
    try:
        done, _ = await asyncio.wait(
            {getter, stopper},
            timeout=max(0.0, tick - time.monotonic()),
            return_when=asyncio.FIRST_COMPLETED,
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
