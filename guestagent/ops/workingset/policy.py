"""The working-set reclaimer's decisions, as pure functions over one interval's figures.

Each interval the loop (reclaimer.py) measures a target cgroup: how long its tasks
stalled on memory (memory.pressure `some` total, delta), how much of what was reclaimed
came back (workingset refaults, delta), memory.current, and, where the multi-gen LRU's ages
are read, how much of it has been idle at least the policy's `cold_after_ms` (cold.py).
`decide` turns that into a step: all that is cold, evicted at once (`evict_cold`), else a
probe of memory.reclaim proportional to the slack below the stall target and the refault
guard, never more than the policy's fraction of memory.current (`probe`); never below the
floor. Over the target it stops and holds off for a number of intervals that grows
fourfold with each back-off, and quarters its probes for each; a step that caused no
refaults or stall works one back-off off again.

A step is written to memory.reclaim in chunks (`stop_step_after_chunk` judges each): once the
kernel steals few of the pages it scans, the rest of the cgroup is referenced, the working set,
and asking on only burns the guest's CPU scanning it.
"""

from __future__ import annotations

import enum
from dataclasses import replace

from guestagent.errors import InvalidArgument
from guestagent.linux.abi import LONG_MAX
from guestagent.ops.idle import DEFAULT_COLD_AFTER_MS
from guestagent.records import record
from guestagent.sizes import MIB

# Hold at most this many intervals after a back-off: 32 s at the default interval, so a
# workload whose hot set grew back is probed again within a minute, not never.
MAX_HOLD_INTERVALS = 32
# Each back-off multiplies the hold and divides the probe by this: a probe's stall grows with
# its size, and halving overspent the stall budget (docs/measurements.md).
BACKOFF_FACTOR = 4
# A back-off is worked off after this many clean steps in a row, so the probe grows 4x every
# four intervals (about 1.4x per interval): one per step grew it back into the hot set.
CLEAN_STEPS_PER_BACKOFF = 4
# A step that got less than 1/UNPRODUCTIVE of what it asked counts as a back-off; so does a
# chunk in which the kernel stole less than 1/UNPRODUCTIVE of the pages it scanned.
UNPRODUCTIVE = 4
# memory.reclaim is asked this much at a time, so a step that reaches the working set stops
# after one chunk, not after the whole step (one large write scans on, unseen by PSI).
CHUNK_BYTES = 1 * MIB
# An eviction of cold generations is asked this much at a time: the kernel cannot cut the
# write short, and this bounds one to tens of ms under TCG (docs/measurements.md), so a
# step still stops within a write of what stops it.
EVICT_CHUNK_BYTES = 4 * MIB
# A step spends at most its interval in memory.reclaim, so the loop keeps its cadence (less
# cut steps of cold anon short where swap-out is slow).
WRITE_BUDGET_SHARE = 1.0


# cold_after_ms's range: the ages' resolution is the aging interval (10 s by default), and a
# day is longer than any layer the idle ager keeps apart.
COLD_AFTER_RANGE_MS = (1_000, 86_400_000)


class Mode(enum.Enum):
    PROBING = "probing"
    BACKING_OFF = "backing_off"
    AT_FLOOR = "at_floor"
    DISABLED = "disabled"


class StepKind(enum.Enum):
    """Which way a step went: what the ages call cold, evicted from the multi-gen LRU's
    oldest generations, or a probe of memory.reclaim."""

    EVICT_COLD = "evict_cold"
    PROBE = "probe"


@record
class ReclaimPolicy:
    """Defaults, and why, are in docs/design-reclaimer.md."""

    interval_ms: int = 1000
    # memory.pressure `some` stall per interval, in us: 0.2 % of a 1 s interval.
    stall_target_us: int = 2000
    max_step_fraction: float = 0.05
    floor_bytes: int = 0
    anon: bool = False
    # Back off when more than this fraction of memory.current refaulted in one interval;
    # 0 turns the guard off.
    refault_guard_fraction: float = 0.005
    # Memory idle at least this long (by the multi-gen LRU's ages) is evicted at once: the
    # give-back figures' threshold.
    cold_after_ms: int = DEFAULT_COLD_AFTER_MS


def _within(name: str, value: float, low: float, high: float) -> None:
    """Refuse a policy field outside [low, high], naming the value and the range; NaN is
    outside any range."""
    if not low <= value <= high:
        raise InvalidArgument(
            f"{name} {value} is outside [{low}, {high}]",
            "RECLAIM_POLICY_INVALID",
            field=f"policy.{name}",
        )


def validate_policy(policy: ReclaimPolicy) -> ReclaimPolicy:
    _within("interval_ms", policy.interval_ms, 100, 600_000)
    interval_us = policy.interval_ms * 1000
    if not 1 <= policy.stall_target_us < interval_us:
        raise InvalidArgument(
            f"stall_target_us {policy.stall_target_us} is outside [1, {interval_us - 1}] "
            f"(below the interval of {policy.interval_ms} ms)",
            "RECLAIM_POLICY_INVALID",
            field="policy.stall_target_us",
        )
    _within("max_step_fraction", policy.max_step_fraction, 0.0001, 0.5)
    _within("refault_guard_fraction", policy.refault_guard_fraction, 0.0, 1.0)
    _within("floor_bytes", policy.floor_bytes, 0, LONG_MAX)
    _within("cold_after_ms", policy.cold_after_ms, *COLD_AFTER_RANGE_MS)
    return policy


@record
class Sample:
    """One interval of one cgroup: deltas since the previous sample, levels now."""

    stall_us: int  # memory.pressure some total, delta.
    refault_bytes: int  # workingset_refault_anon + _file, delta, in bytes.
    current: int  # memory.current.
    protected: int  # max(memory.min, memory.low): the kernel's own floor for this cgroup.
    reclaimed_bytes: int = 0  # What the previous interval's step got from memory.reclaim.
    # Why the previous step stopped early because the kernel found the rest referenced
    # ("" if it did not): as good as a refault, and caught before one happens.
    low_yield: str = ""
    # What the ages say may be evicted now (idle at least cold_after_ms, within the swap
    # rule and the floors: cold.py); 0 without ages.
    cold_bytes: int = 0
    # What the ages say has not been used since the last aging (cold.py): all a probe may
    # find; None without ages (a probe is then bounded by its step alone).
    cooling_bytes: int | None = None


@record
class ControllerState:
    mode: Mode = Mode.PROBING
    why: str = "waiting for the first interval's figures"
    hold: int = 0  # Intervals left before probing again.
    backoffs: int = 0  # Sets the next hold: 4**(backoffs-1) intervals, up to MAX_HOLD_INTERVALS.
    last_step: int = 0  # The previous interval's step, 0 for none: this sample judges it.
    clean_steps: int = 0  # Clean steps in a row since the last back-off was worked off.
    last_kind: StepKind = StepKind.PROBE  # Which way the previous step went.

    @property
    def stepped(self) -> bool:
        return self.last_step > 0


@record
class Decision:
    step_bytes: int
    state: ControllerState
    kind: StepKind = StepKind.PROBE


def floor_of(policy: ReclaimPolicy, protected: int) -> int:
    return max(policy.floor_bytes, protected)


def decide(
    sample: Sample, policy: ReclaimPolicy, state: ControllerState, page_size: int
) -> Decision:
    guard_bytes = policy.refault_guard_fraction * sample.current
    over_stall = sample.stall_us > policy.stall_target_us
    over_refault = policy.refault_guard_fraction > 0 and sample.refault_bytes > guard_bytes
    # The kernel found little to take: what is left is referenced, the working set. Asking
    # again only burns the guest's CPU scanning it, slowing the workload. An eviction asks
    # for what the ages call cold, and one cut short by its time budget is not a sign of it.
    unproductive = (
        state.stepped
        and state.last_kind == StepKind.PROBE
        and sample.reclaimed_bytes * UNPRODUCTIVE < state.last_step
    )
    low_yield = state.stepped and bool(sample.low_yield)
    if over_stall or over_refault or unproductive or low_yield:
        backoffs = state.backoffs + 1
        hold = min(BACKOFF_FACTOR ** min(backoffs - 1, 8), MAX_HOLD_INTERVALS)
        reasons = []
        if over_stall:
            reasons.append(f"stall {sample.stall_us} us over target {policy.stall_target_us} us")
        if over_refault:
            reasons.append(
                f"refaults {sample.refault_bytes} B over guard {int(guard_bytes)} B "
                f"({policy.refault_guard_fraction:g} of memory.current)"
            )
        if unproductive:
            reasons.append(
                f"the last step got {sample.reclaimed_bytes} B of {state.last_step} B: "
                "little cold memory left"
            )
        if low_yield and not unproductive:
            reasons.append(f"the last step stopped early: {sample.low_yield}")
        why = f"{' and '.join(reasons)}; holding {hold} interval(s)"
        return Decision(0, ControllerState(Mode.BACKING_OFF, why, hold, backoffs, 0))

    # A clean interval after a step: the step did not cut into the working set. Enough of
    # them in a row work one back-off off.
    backoffs, clean_steps = state.backoffs, state.clean_steps
    if state.stepped and backoffs > 0:
        clean_steps += 1
        if clean_steps >= CLEAN_STEPS_PER_BACKOFF:
            backoffs, clean_steps = backoffs - 1, 0
    if state.hold > 0:
        why = f"holding after a back-off, {state.hold - 1} interval(s) left"
        return Decision(0, replace(state, mode=Mode.BACKING_OFF, why=why, hold=state.hold - 1))

    floor = floor_of(policy, sample.protected)
    headroom = sample.current - floor
    if headroom < page_size:
        why = f"memory.current {sample.current} B is at the floor {floor} B"
        return Decision(0, ControllerState(Mode.AT_FLOOR, why, 0, backoffs, 0, clean_steps))

    # What the ages call cold goes at once, whatever the slack: it is not the working set.
    # Less than a chunk waits until more is cold, as a probe does (below): a few pages going
    # cold each interval otherwise made an eviction write every second after the burst
    # (12 KiB at a time on the kata-fc boot, 2026-12-08), and a reclaimer that never pauses
    # holds back the compaction that follows a burst (compaction_trigger.py).
    cold = min(sample.cold_bytes, headroom)
    cold -= cold % page_size
    if cold >= CHUNK_BYTES:
        why = (
            f"evicting {cold} B idle at least {policy.cold_after_ms / 1000:g} s "
            f"of {sample.current} B (floor {floor} B)"
        )
        state = ControllerState(
            Mode.PROBING, why, 0, backoffs, cold, clean_steps, StepKind.EVICT_COLD
        )
        return Decision(cold, state, StepKind.EVICT_COLD)

    slack = 1.0 - sample.stall_us / policy.stall_target_us
    if policy.refault_guard_fraction > 0 and guard_bytes > 0:
        slack = min(slack, 1.0 - sample.refault_bytes / guard_bytes)
    slack = min(1.0, max(0.0, slack))
    # Each back-off not yet worked off quarters the probe: the last steps cut into the
    # working set, so the next ones approach it more carefully.
    full = policy.max_step_fraction * sample.current * slack
    step = int(full / BACKOFF_FACTOR ** min(backoffs, 8))
    if full >= page_size:
        step = max(step, page_size)  # The smallest probe is a page, so back-offs wear off.
    step = min(step, headroom)
    step -= step % page_size
    # With ages, memory used since the last aging is the working set: a probe only ever looks
    # for what is cooling, and less than a chunk of it is not worth one, since the kernel
    # takes at least 32 pages a write whatever it is asked (mm/vmscan.c SWAP_CLUSTER_MAX).
    if sample.cooling_bytes is not None and step > 0:
        if sample.cooling_bytes < CHUNK_BYTES:
            why = (
                f"the ages show {sample.cooling_bytes} B unused since the last aging, under "
                f"{CHUNK_BYTES} B: nothing worth a probe"
            )
            return Decision(0, ControllerState(Mode.PROBING, why, 0, backoffs, 0, clean_steps))
        step = min(step, sample.cooling_bytes - sample.cooling_bytes % page_size)
    if step <= 0:
        why = f"slack {slack:.2f} below the target leaves less than a page to reclaim"
        return Decision(0, ControllerState(Mode.PROBING, why, 0, backoffs, 0, clean_steps))
    why = f"slack {slack:.2f}: reclaiming {step} B of {sample.current} B (floor {floor} B)"
    return Decision(step, ControllerState(Mode.PROBING, why, 0, backoffs, step, clean_steps))


def low_yield(scanned_pages: int | None, stolen_pages: int | None) -> bool:
    """A chunk in which the kernel stole under 1/UNPRODUCTIVE of the pages it scanned."""
    return (
        bool(scanned_pages)
        and stolen_pages is not None
        and (stolen_pages * UNPRODUCTIVE < (scanned_pages or 0))
    )


def stop_step_after_chunk(
    chunks: tuple[tuple[int | None, int | None], ...],
    refaulted_pages: int,
    done_bytes: int,
    spent_s: float,
    interval_s: float,
    page_size: int,
) -> tuple[str, bool]:
    """After a chunk of a step: (why to stop, "" to go on; whether the why is the working set
    reached). `chunks` are the step's (pgscan, pgsteal) deltas so far, from memory.stat, None
    where the kernel does not report them; `refaulted_pages` the cgroup's workingset refaults
    since the step began, `done_bytes` what it has reclaimed.

    Refaults while the step runs are the surest sign: a hot loop touches what was just taken
    within its next pass, while the kernel, having just cleared the referenced bits, still
    steals nearly every page it scans. A low yield is the other: one low-yield chunk can be the
    kernel sorting referenced pages onto the active list for the first time; two in a row is
    the working set. (docs/measurements.md has the runs behind both.)"""
    if refaulted_pages * page_size * UNPRODUCTIVE > done_bytes:
        return (
            f"{refaulted_pages} pages refaulted while it reclaimed {done_bytes} B: "
            "it reached the working set",
            True,
        )
    if len(chunks) >= 2 and all(low_yield(*chunk) for chunk in chunks[-2:]):
        scanned = sum(chunk[0] or 0 for chunk in chunks[-2:])
        stolen = sum(chunk[1] or 0 for chunk in chunks[-2:])
        return (
            f"the kernel stole {stolen} of the {scanned} pages it scanned in two chunks: "
            "the rest is referenced",
            True,
        )
    budget = interval_s * WRITE_BUDGET_SHARE
    if spent_s > budget:
        return f"memory.reclaim took {spent_s * 1000:.0f} ms, over {budget * 1000:.0f} ms", False
    return "", False
