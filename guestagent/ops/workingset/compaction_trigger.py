"""The working-set reclaimer's compaction trigger: when free memory is left in blocks too
small for free page reporting to hand back, compact (rate-limited, and soon after a burst of
reclaim settles). `compaction_decision` is the pure rule; CompactionTrigger applies it on the
reclaimer's thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from guestagent.errors import AgentError
from guestagent.linux.abi import reporting_order
from guestagent.linux.delayacct import DelayStallMeter
from guestagent.linux.kernel import Kernel
from guestagent.linux.meminfo import read_system_pressure
from guestagent.linux.mm import read_free_blocks_optional
from guestagent.ops.compaction import Compactor, free_bytes_at_or_above
from guestagent.ops.workingset.policy import ReclaimPolicy
from guestagent.records import record
from guestagent.sizes import MIB

# How often the rule is looked at while any target is on; the rule itself limits how often
# compaction runs.
CHECK_EVERY_S = 10.0


@record
class CompactionRule:
    # Rate limit: kata's mem-agent compacts at most every 10 min; a guest that has just given
    # back hundreds of MiB gains most in the first minute, so once a minute at most.
    min_gap_s: float = 60.0
    # Compact when this much free memory sits in blocks below 2 MiB, whatever its share of
    # free memory: stranded there after reclaim, it is never given back to the host. 64 MiB
    # left 55-65 MiB (a tenth of a 552 MiB cold workload) with the guest (2026-12-06).
    stranded_bytes: int = 32 * MIB
    # Sooner than min_gap_s once the reclaimer has freed this much since the last run and
    # paused: what a long burst of reclaim freed after the first run is scattered again.
    settled_after_bytes: int = 32 * MIB
    # ... or once it has paused after freeing anything since a run that came in the middle
    # of its burst, with this much more in small blocks than that run left: the burst's
    # tail. A run at 10 s into an eviction that went on to 11 s left 0.938 of the cold set
    # back at 30 s and 95 % only at 74.6 s, after the next standing run (kata-fc boot,
    # 2026-12-08). Never twice on the same stranded memory: what compaction cannot move (free
    # pages between the kernel's own) does not count again.
    settled_growth_bytes: int = 8 * MIB
    settled_min_gap_s: float = 10.0
    # ... and then a lower bar, as that run is once per burst and what the burst scattered is
    # where compaction pays: after 380 MiB reclaimed, a guest kept 29.7 MiB free in blocks
    # under 2 MiB, short of stranded_bytes, in QEMU's RSS for minutes (2026-12-07).
    settled_stranded_bytes: int = 8 * MIB


def small_free_bytes(free_blocks: tuple[int, ...], page_size: int) -> int:
    """Free memory in blocks under the order free page reporting hands back."""
    all_free = free_bytes_at_or_above(free_blocks, 0, page_size)
    return all_free - free_bytes_at_or_above(free_blocks, reporting_order(page_size), page_size)


def compaction_decision(
    free_blocks: tuple[int, ...],
    page_size: int,
    stall_us: int,
    stall_target_us: int,
    since_last_s: float | None,
    rule: CompactionRule = CompactionRule(),
    reclaimed_since_bytes: int = 0,
    reclaiming: bool = False,
    small_after_last_run_bytes: int | None = None,
) -> tuple[bool, str]:
    """Whether compacting now pays: free memory mostly in blocks free page reporting cannot
    take, the guest calm, and the last run long enough ago (or the reclaimer has freed a lot
    since and paused, or paused after a run in its burst with more stranded since: what it
    freed is scattered). `small_after_last_run_bytes`: free memory in small blocks as the
    last run ended (None: no run yet). Returns (run, why)."""
    small = small_free_bytes(free_blocks, page_size)
    total = free_bytes_at_or_above(free_blocks, 0, page_size)
    share = small / total if total else 0.0
    block = (page_size << reporting_order(page_size)) // MIB
    figures = f"{small // MIB} MiB of {total // MIB} MiB free is in blocks under {block} MiB"
    burst_over = not reclaiming and reclaimed_since_bytes >= rule.settled_after_bytes
    # More in small blocks than the last run left (none: no run yet).
    grown = 0 if small_after_last_run_bytes is None else small - small_after_last_run_bytes
    burst_tail = (
        not reclaiming
        and reclaimed_since_bytes > 0
        and small_after_last_run_bytes is not None
        and grown >= rule.settled_growth_bytes
    )
    settled = burst_over or burst_tail
    gap = rule.settled_min_gap_s if settled else rule.min_gap_s
    if since_last_s is not None and since_last_s < gap:
        return False, f"ran {since_last_s:.0f} s ago (at most every {gap:.0f} s)"
    if stall_us > stall_target_us:
        return False, f"system stall {stall_us} us over {stall_target_us} us; {figures}"
    if small < (rule.settled_stranded_bytes if settled else rule.stranded_bytes):
        return False, f"not worth it: {figures}"
    after = f"; {reclaimed_since_bytes // MIB} MiB reclaimed since the last run" if settled else ""
    if burst_tail and not burst_over:
        after += f", {grown // MIB} MiB more in small blocks than it left"
    return True, f"{figures} ({share:.0%}){after}"


@record
class CompactionStatus:
    runs: int = 0
    last_decision: str = "not checked yet"
    last_run_unix_ns: int = 0


class CompactionTrigger:
    """Looks at the rule at most every CHECK_EVERY_S, and compacts when it says so.

    Called from the reclaimer's thread only; `status` is read from others, and is replaced
    whole, never changed in place.
    """

    def __init__(
        self,
        kernel: Kernel,
        clock: Callable[[], float],
        page_size: int,
        rule: CompactionRule | None = None,
        stall: DelayStallMeter | None = None,
    ) -> None:
        """`stall`: delay accounting's meter, whose whole-guest stall is the calm bar where
        the guest has no PSI (None: without PSI it never compacts)."""
        self.kernel = kernel
        self._stall = stall
        self._clock = clock
        self._page_size = page_size
        self._rule = rule or CompactionRule()
        self._compactor = Compactor(kernel, page_size)
        self.status = CompactionStatus()
        self._checked: float | None = None
        self._compacted_at: float | None = None
        self._system_stall_us: int | None = None
        self._reclaimed_since = 0
        self._small_after_run: int | None = None  # Free in small blocks as the last run ended.

    @property
    def checked(self) -> bool:
        return self._checked is not None

    def reclaimed(self, bytes_: int) -> None:
        self._reclaimed_since += bytes_

    def maybe_compact(self, policies: Sequence[ReclaimPolicy], reclaiming: bool) -> None:
        """`policies` of the targets that are on; `reclaiming` whether any stepped last."""
        now = self._clock()
        if self._checked is not None and now - self._checked < CHECK_EVERY_S:
            return
        stall_total = self._read_system_stall_us()
        free_blocks = read_free_blocks_optional(self.kernel)
        if not policies or stall_total is None or free_blocks is None:
            return
        elapsed = now - self._checked if self._checked else None
        previous = self._system_stall_us
        self._checked, self._system_stall_us = now, stall_total
        if elapsed is None or previous is None:
            return  # The first check is the baseline for the stall delta.
        # The system's calm bar: the strictest target's stall rate over the elapsed time.
        allowed = int(min(p.stall_target_us / p.interval_ms for p in policies) * elapsed * 1000)
        since = now - self._compacted_at if self._compacted_at is not None else None
        run, why = compaction_decision(
            free_blocks,
            self._page_size,
            stall_total - previous,
            allowed,
            since,
            self._rule,
            self._reclaimed_since,
            reclaiming,
            self._small_after_run,
        )
        runs, last_run = self.status.runs, self.status.last_run_unix_ns
        if run:
            try:
                result = self._compactor.compact_blocking()
            except (AgentError, OSError) as e:
                why = f"compaction failed: {e}"
            else:
                runs, last_run = runs + 1, time.time_ns()
                self._small_after_run = small_free_bytes(result.free_blocks_after, self._page_size)
                why = f"ran: {why}"
            self._compacted_at = self._clock()
            self._reclaimed_since = 0
        self.status = CompactionStatus(runs, why, last_run)

    def _read_system_stall_us(self) -> int | None:
        """The whole guest's stall so far: PSI's, else delay accounting's; None with neither."""
        pressure = read_system_pressure(self.kernel)
        if pressure is not None and not (self._stall and self._stall.stands_in(True)):
            return pressure.some.total_us
        if self._stall is None or self._stall.absence() is not None:
            return None
        return self._stall.guest_total_us()
