"""`guestctl give-back --follow`: keep a balloon (or a virtio-mem device) at the agent's safe
figure as it moves, fed by WatchMemory.

Everything is counted in bytes the device has taken from the guest (a balloon's size, or
what a virtio-mem device has unplugged of what it had when the loop began), so one rule
serves both. The rule (`decide`, pure): take more only once the figure has allowed it for
`hold_seconds` (and then the least it allowed in that time), compacting first and again once
the device has it, as the one-shot command does; give back at once when the figure falls
below what the device holds, when the agent's target is at MemTotal and the guest stalls at
all (it needs more than it has), or when the guest's memory stall crosses a threshold, each
over two reports in a row (one, at twice the threshold) while the device is not inflating
and the guest has less than a step free, by a step that doubles on each within seconds of
the last; never take more than the figure allows. A device that stops short of what it was
asked is asked for where it stands, as the one-shot command does.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import grpc

from guestagent.host.client import WatchStream, describe_error
from guestagent.host.display import mib
from guestagent.host.giveback.oneshot import Agent, virtio_mem_device
from guestagent.host.giveback.plan import (
    BALLOON,
    STILL_SECONDS,
    pick_virtio_mem,
    safe_balloon_taken,
    safe_virtio_mem,
)
from guestagent.host.streams import Reopening, Watchdog
from guestagent.host.units import round_down
from guestagent.host.vmm.base import Vmm, VmmError
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb

PSI_SOME, DELAYACCT = "psi_some", "delayacct_stall"


@dataclass(frozen=True)
class Policy:
    # The figure must allow more for this long before the device takes it: a figure that dips
    # for one report (a process exiting, an aging) is not a reason to inflate.
    hold_seconds: float = 30.0
    # Share of time some task stalled on memory, over the last report's interval, that makes
    # the loop give back at once. The agent's default PSI trigger is 15 % (150 ms in 1 s).
    stall_threshold: float = 0.10
    # How much to give back on a stall or a target at MemTotal, where the figure says nothing:
    # the first step; each one in the same run after it doubles, up to step_doublings times.
    step: int = 128 * MIB
    # A guest still short after a step is short by more than a step: 300 MiB of growth took
    # three 128 MiB steps, one a report, while the hot set went to swap (a hot loop 1.21x
    # slower, 2026-12-05); 128, 256, 512 let the growth out in two.
    step_doublings: int = 2
    # A step within this long of the last one is part of the same run, whatever the reports
    # between said: after a step the guest has a step free for a report or two (so it is
    # given none) while the growth eats it. Counting reports, CI's miss of 2026-12-06 (a
    # hot loop 1.28x slower) got 128 MiB, then 128 again 4.4 s later, then 256.
    run_seconds: float = 10.0
    # A smaller rise in the figure is not worth a request.
    min_change: int = 8 * MIB
    # With the agent's target at MemTotal, this much stall says the guest wants more than it
    # has: at the figure the target is MemTotal by construction, so that alone says nothing.
    saturated_stall: float = 0.01
    # A device unmoved this long short of what it was asked is asked for where it stands.
    still_seconds: float = STILL_SECONDS
    # Compact the guest around an inflation only when this much free memory sits in blocks
    # too small for free page reporting (the report's free_fragmented): less is not worth
    # migrating the workload's pages, which stalls it under the balloon's own work. The
    # agent's reclaimer compacts at the same 32 MiB.
    compact_at_fragmented: int = 32 * MIB


@dataclass(frozen=True)
class StallSample:
    source: str  # PSI_SOME or DELAYACCT: totals of different sources never compare.
    total_us: int  # Monotonic, like PSI's some total.
    at: float  # Seconds, on the host's monotonic clock.


def stall_share(previous: StallSample | None, now: StallSample | None) -> float | None:
    """The share of time stalled between two samples; None without two comparable ones (a
    different source, a total that went back as after an agent's restart)."""
    if previous is None or now is None or previous.source != now.source:
        return None
    elapsed = now.at - previous.at
    if elapsed <= 0 or now.total_us < previous.total_us:
        return None
    return min(1.0, (now.total_us - previous.total_us) / 1e6 / elapsed)


def sustained_stall(previous: float | None, share: float | None, policy: Policy) -> float | None:
    """The stall the loop acts on, from the last two reports' shares: the lesser, as one
    interval's stall is often a burst that has passed; the last alone once it is twice the
    threshold, as a guest that short is swapping its hot set while a second report is
    awaited."""
    if share is not None and share >= 2 * policy.stall_threshold:
        return share
    return None if share is None or previous is None else min(share, previous)


def step_back(run_steps: int, policy: Policy) -> int:
    """The size of a stall's (or a saturated target's) give-back once its run has taken that
    many steps."""
    return policy.step << min(run_steps, policy.step_doublings)


def steps_in_run(steps: int, last_step_at: float | None, now: float, policy: Policy) -> int:
    """How many steps back the run in progress has taken: `steps` while the last of them is
    no more than run_seconds old, else none (a new run)."""
    if last_step_at is None or now - last_step_at > policy.run_seconds:
        return 0
    return steps


def delay_stall_sample(info: pb.MemoryInfo, at: float) -> StallSample | None:
    """The delay-accounting stall (MemoryInfo.delay_stall), for guests without PSI."""
    if not info.HasField("delay_stall"):
        return None
    return StallSample(info.delay_stall.source or DELAYACCT, info.delay_stall.total_us, at)


def stall_sample(info: pb.MemoryInfo, at: float) -> StallSample | None:
    """PSI's some total where the guest has PSI, else the delay-accounting stall, else None."""
    if info.HasField("pressure") and info.pressure.HasField("some"):
        return StallSample(PSI_SOME, info.pressure.some.total_us, at)
    return delay_stall_sample(info, at)


@dataclass(frozen=True)
class Reading:
    """One report and the device's state, in bytes taken from the guest."""

    taken: int  # What the device holds now.
    safe: int | None  # The most it may hold by the agent's figure; None without one.
    saturated: bool  # The agent's target is at MemTotal: the guest needs all it has.
    unit: int  # The VMM takes sizes in whole units of this.
    free: int | None = None  # The guest's MemFree; None without a report of it.


@dataclass(frozen=True)
class Hold:
    """A rise in the figure waiting to have held long enough."""

    since: float
    lowest: int  # The least the figure allowed since.


@dataclass(frozen=True)
class Change:
    to: int  # Bytes taken.
    cause: str  # "held", "figure", "saturated", "stall", "stopped": a metric's label.
    detail: str


def decide(
    reading: Reading,
    asked: int,
    stall: float | None,
    now: float,
    hold: Hold | None,
    policy: Policy,
    stall_source: bool = True,
    run_steps: int = 0,
) -> tuple[Change | None, Hold | None]:
    """(the change to make or None, the hold to keep) for one report; `asked` is what the
    device was last asked to hold; `stall` the share of time stalled (None: not measured
    this time), `stall_source` whether the guest reports a stall at all, `run_steps`
    how many stall or saturated steps back the run in progress has taken (steps_in_run)."""
    step = step_back(run_steps, policy)
    room = reading.safe if reading.safe is not None else asked
    # While the device is still taking what it was asked, the guest stalls making room for
    # it (pushing its cold set to swap): that stall is the give-back's own doing, and
    # deflating on it undid each inflation (seen: 14 deflates in 4 minutes); a guest that
    # grows meanwhile raises the figure, which the next rule follows.
    inflating = reading.taken < asked
    stalled = stall is not None and stall >= policy.stall_threshold
    # A guest with a step free is not short of memory, whatever it stalls on: pages coming
    # back from swap after a growth, which more memory does not speed. Stepping on that stall
    # gave a 300 MiB growth all 681 MiB the balloon held (2026-12-05).
    short = reading.free is None or reading.free < policy.step
    if stalled and asked > 0 and not inflating and short:
        to = round_down(max(0, min(room, asked - step)), reading.unit)
        return Change(to, "stall", f"memory stall {stall:.1%} of the interval"), None
    if reading.safe is None:
        return None, None  # No figure: hold still; the stall still lets the guest out.
    # Below what the device holds, or well below what it was asked: a few pages' move of the
    # figure while the device is still on its way is not worth a request.
    if reading.safe < reading.taken or asked - reading.safe >= policy.min_change:
        to = round_down(reading.safe, reading.unit)
        return Change(to, "figure", f"the figure fell to {mib(reading.safe)}"), None
    # With the balloon deflate-on-oom off, the target is capped at a MemTotal the balloon
    # lowers, so the figure never asks below what the balloon holds: a guest that needs more
    # than it has shows as a target at MemTotal and a stall (or, with no stall to read, the
    # target alone).
    wants_more = stall is not None and stall >= policy.saturated_stall
    if (
        reading.saturated
        and asked > 0
        and not inflating
        and short
        and (wants_more or not stall_source)
    ):
        to = round_down(max(0, asked - step), reading.unit)
        return Change(to, "saturated", "the agent's target is MemTotal and the guest stalls"), None
    # A target at MemTotal is the guest needing all it has, and a guest that stalls (with
    # nothing to let out yet, or while the device still takes what it was asked) is short
    # already: never the time to take more. The figure is held afresh once it stops.
    if reading.saturated or stalled or reading.safe - asked < policy.min_change:
        return None, None
    if hold is None:
        hold = Hold(now, reading.safe)
    else:
        hold = Hold(hold.since, min(hold.lowest, reading.safe))
    held = now - hold.since
    if held < policy.hold_seconds:
        return None, hold
    to = round_down(hold.lowest, reading.unit)
    if to - asked < policy.min_change:
        return None, None
    return Change(to, "held", f"the figure allowed {mib(hold.lowest)} for {held:.0f} s"), None


def stopped_short(taken: int, asked: int, unmoved_since: float, now: float, policy: Policy) -> bool:
    """A device asked for more than it holds that has not moved for still_seconds."""
    return taken < asked and now - unmoved_since >= policy.still_seconds


class Knob(Protocol):
    """What the loop moves: a balloon, or a virtio-mem device."""

    what: str

    def read(self, info: pb.MemoryInfo) -> Reading: ...

    def asked(self) -> int: ...

    def set(self, taken: int) -> None: ...


def _saturated(info: pb.MemoryInfo) -> bool:
    giveback = info.giveback
    return giveback.HasField("safe_balloon_target") and (
        giveback.safe_balloon_target.bytes >= info.system.mem_total_bytes
    )


def compaction_pays(info: pb.MemoryInfo, policy: Policy) -> bool:
    """Whether compacting the guest now would hand the host enough: free memory stranded in
    blocks below free page reporting's order, at least compact_at_fragmented of it. A report
    without the figure (an agent before it) compacts, as the loop always did."""
    giveback = info.giveback
    if not info.HasField("giveback") or not giveback.HasField("free_fragmented"):
        return True
    return giveback.free_fragmented.bytes >= policy.compact_at_fragmented


def _free(info: pb.MemoryInfo) -> int | None:
    return info.system.mem_free_bytes if info.HasField("system") else None


class BalloonKnob:
    what = BALLOON

    def __init__(self, vmm: Vmm) -> None:
        self.vmm = vmm

    def read(self, info: pb.MemoryInfo) -> Reading:
        balloon = self.vmm.balloon()
        safe, _ = safe_balloon_taken(info, balloon)
        return Reading(balloon.taken, safe, _saturated(info), balloon.unit, _free(info))

    def asked(self) -> int:
        return self.vmm.balloon().asked

    def set(self, taken: int) -> None:
        self.vmm.set_balloon(taken)


class VirtioMemKnob:
    """A virtio-mem device, counted as what it has unplugged of what it had at the start."""

    def __init__(self, vmm: Vmm, device: str) -> None:
        self.vmm = vmm
        self.what = device
        self.base = virtio_mem_device(vmm, device).size

    def read(self, info: pb.MemoryInfo) -> Reading:
        device = virtio_mem_device(self.vmm, self.what)
        safe, _ = safe_virtio_mem(info, device)
        safe_taken = None if safe is None else max(0, self.base - safe)
        taken = self.base - device.size
        return Reading(taken, safe_taken, _saturated(info), device.block_size, _free(info))

    def asked(self) -> int:
        return self.base - virtio_mem_device(self.vmm, self.what).requested_size

    def set(self, taken: int) -> None:
        device = virtio_mem_device(self.vmm, self.what)
        self.vmm.set_virtio_mem(device, self.base - taken)


class Metrics(Protocol):
    def observe(self, reading: Reading, asked: int, stall: float | None) -> None: ...

    def changed(self, change: Change, direction: str) -> None: ...


@dataclass(frozen=True)
class FollowOptions:
    json: bool = False  # A JSON object per line instead of text.
    # An agent or a VMM that has not answered this long is gone (its VM was shut down): the
    # loop ends, with GONE, rather than retry forever.
    gone_seconds: float = 30.0
    # A stream that says nothing this long is broken (the agent sends a report at least every
    # interval): cancelled by the watchdog and opened again.
    quiet_seconds: float = 6.0


# run()'s exit status: stopped (SIGTERM), or its agent or VMM gone.
STOPPED, GONE = 0, 3


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Follower:
    """The loop: one WatchMemory stream (`watch` opens it), a decision per report, one line
    per change. It never skips a deflate because a read failed: a VMM that does not answer
    the read is still asked to let a stalling guest out (from the last size it reported), and
    while the agent says nothing the balloon is let out a step each time its stream breaks.
    An agent or VMM silent for gone_seconds ends the loop."""

    def __init__(
        self,
        watch: Callable[[], WatchStream],
        agent: Agent,
        vmm_name: str,
        knob: Knob,
        policy: Policy,
        options: FollowOptions,
        metrics: Metrics | None = None,
        out: Callable[[str], None] = lambda line: print(line, flush=True),
        clock: Callable[[], float] = time.monotonic,
        watchdog: Watchdog | None = None,
        err: Callable[[str], None] = _stderr,
    ) -> None:
        self.watch, self.agent, self.vmm_name, self.knob = watch, agent, vmm_name, knob
        self.policy, self.options = policy, options
        self.metrics = metrics
        self.out, self.clock, self.err = out, clock, err
        self.watchdog = watchdog
        self._reports = Reopening(watch, self._broken, clock)
        self._asked = 0
        self._hold: Hold | None = None
        self._stall: StallSample | None = None
        self._share: float | None = None
        self._last_taken = -1
        self._unmoved_since = 0.0
        self._run_steps = 0
        self._last_step_at: float | None = None
        # An inflation not yet reached: once it is, compact (as the one-shot command does).
        self._inflating = False
        # The last reading the VMM gave: a failed read decides from it.
        self._last_reading: Reading | None = None
        # Since when the VMM, or the agent, has not answered; None while it does.
        self._vmm_silent_since: float | None = None
        self._agent_silent_since: float | None = None
        self.gone: str | None = None  # Why the loop ended on its own.

    def stop(self) -> None:
        """From a signal handler or another thread: the loop ends after the report in hand."""
        self._reports.stop()

    def say(self, event: str, **fields: Any) -> None:
        if self.options.json:
            self.out(json.dumps({"event": event, **fields}))
            return
        detail = "; ".join(f"{k} {v}" for k, v in fields.items())
        self.out(f"give-back --follow: {event}: {detail}")

    def _ended(self, why: str) -> None:
        self.gone = why
        self._reports.stop()

    def _broken(self, error: str, delay: float) -> None:
        """The stream broke (or went quiet): the agent is silent. Let the guest out a step,
        as a silent agent may be one whose guest thrashes; past gone_seconds, end."""
        self.err(f"guestctl: give-back --follow: {error}; again in {delay:.1f} s")
        now = self.clock()
        if self._agent_silent_since is None:
            self._agent_silent_since = now
        if now - self._agent_silent_since >= self.options.gone_seconds:
            self._ended(f"the agent has not answered for {now - self._agent_silent_since:.0f} s")
            return
        if self._asked > 0:
            in_run = steps_in_run(self._run_steps, self._last_step_at, now, self.policy)
            to = round_down(max(0, self._asked - step_back(in_run, self.policy)), self._unit())
            self._run_steps, self._last_step_at = in_run + 1, now
            try:
                self._change(Change(to, "silent", f"the agent is silent: {error}"), None, None, now)
            except VmmError as e:  # The VM is gone with its agent: the VMM's bound ends it.
                self._vmm_gone(e)

    def _unit(self) -> int:
        return self._last_reading.unit if self._last_reading is not None else 4096

    def _read(self, info: pb.MemoryInfo, now: float) -> Reading:
        """The device's reading; when the VMM does not answer, the last one it gave, with no
        figure (the figure needs the device's size now) but this report's free memory and
        saturation, so a stall still lets the guest out."""
        try:
            reading = self.knob.read(info)
        except VmmError:
            if self._vmm_silent_since is None:
                self._vmm_silent_since = now
            if self._last_reading is None:
                raise
            last = self._last_reading
            return Reading(last.taken, None, _saturated(info), last.unit, _free(info))
        self._vmm_silent_since = None
        self._last_reading = reading
        return reading

    def step(self, info: pb.MemoryInfo) -> Change | None:
        """One report: read, decide, act. Returns the change made."""
        now = self.clock()
        self._agent_silent_since = None
        reading = self._read(info, now)
        if self._inflating and reading.taken >= self._asked:
            # The guest swapped and freed pages where they lay to make room; free page
            # reporting hands over only whole blocks.
            if compaction_pays(info, self.policy):
                self.agent.compact()
            self._inflating = False
        sample = stall_sample(info, now)
        share = stall_share(self._stall, sample)
        if reading.taken < self._asked:
            share = None  # Inflating: the stall is the inflation's own (see decide).
        stall = sustained_stall(self._share, share, self.policy)
        self._stall, self._share = sample, share
        if reading.taken != self._last_taken:
            self._last_taken, self._unmoved_since = reading.taken, now
        in_run = steps_in_run(self._run_steps, self._last_step_at, now, self.policy)
        change, self._hold = decide(
            reading,
            self._asked,
            stall,
            now,
            self._hold,
            self.policy,
            sample is not None,
            in_run,
        )
        if change is not None and change.cause in ("stall", "saturated"):
            self._run_steps, self._last_step_at = in_run + 1, now
        if change is None and stopped_short(
            reading.taken, self._asked, self._unmoved_since, now, self.policy
        ):
            detail = f"unmoved {now - self._unmoved_since:.0f} s short of {mib(self._asked)}"
            change = Change(reading.taken, "stopped", detail)
        if self.metrics is not None:
            self.metrics.observe(reading, self._asked, stall)
        if change is None or change.to == self._asked:
            return None
        return self._change(change, reading, stall, now, info)

    def _change(
        self,
        change: Change,
        reading: Reading | None,
        stall: float | None,
        now: float,
        info: pb.MemoryInfo | None = None,
    ) -> Change | None:
        """Ask the device for change.to and say so."""
        direction = "inflate" if change.to > self._asked else "deflate"
        if direction == "inflate" and info is not None and compaction_pays(info, self.policy):
            self.agent.compact()  # As the one-shot command: the pages given up lie together.
        self.knob.set(change.to)
        self.say(
            direction,
            device=self.knob.what,
            cause=change.cause,
            why=change.detail,
            taken_before=None if reading is None else reading.taken,
            asked_before=self._asked,
            asked=change.to,
            safe=None if reading is None else reading.safe,
            stall=None if stall is None else round(stall, 4),
        )
        if self.metrics is not None:
            self.metrics.changed(change, direction)
        self._asked = change.to
        self._unmoved_since = now  # A new ask: its own still time.
        # A device stopped short is asked for where it stood: reached, like a full inflation.
        self._inflating = direction == "inflate" or change.cause == "stopped"
        return change

    def _vmm_gone(self, error: VmmError) -> None:
        """A VMM that did not answer: past gone_seconds of it, the loop ends."""
        now = self.clock()
        if self._vmm_silent_since is None:
            self._vmm_silent_since = now
        self.err(f"guestctl: give-back --follow: {describe_error(error)}")
        if now - self._vmm_silent_since >= self.options.gone_seconds:
            self._ended(
                f"{self.vmm_name} has not answered for {now - self._vmm_silent_since:.0f} s"
            )

    def run(self) -> int:
        """Until stop() (STOPPED) or its agent or VMM is gone (GONE): the device is left
        where it is, and the last line says so."""
        self._asked = self.knob.asked()
        self.say(
            "following",
            vmm=self.vmm_name,
            device=self.knob.what,
            asked=self._asked,
            policy=asdict(self.policy),
        )
        if self.watchdog is not None:
            self.watchdog.guard(self._reports, self.options.quiet_seconds)
        try:
            for info in self._reports:
                if self._reports.stopping.is_set():
                    break
                try:
                    self.step(info)
                except VmmError as e:
                    self._vmm_gone(e)
                except grpc.RpcError as e:  # A compaction the agent refused or timed out.
                    self.err(f"guestctl: give-back --follow: {describe_error(e)}")
        finally:
            if self.watchdog is not None:
                self.watchdog.forget(self._reports)
        try:
            taken: int | None = self.knob.read(pb.MemoryInfo()).taken
        except VmmError:
            taken = None
        left = {"left_asked": self._asked, "left_taken": taken}
        note = "the device is left where it is"
        if self.gone is not None:
            self.say("gone", device=self.knob.what, why=self.gone, **left, note=note)
            return GONE
        self.say("stopped", device=self.knob.what, **left, note=note)
        return STOPPED


def knob_for(vmm: Vmm, via: str, device: str | None) -> Knob:
    if via == BALLOON:
        return BalloonKnob(vmm)
    return VirtioMemKnob(vmm, pick_virtio_mem(vmm.virtio_mem(), device).id)
