from __future__ import annotations

from pathlib import Path

import pytest

from guestagent.linux.delayacct import DelayStallMeter
from guestagent.ops.workingset.compaction_trigger import (
    CompactionRule,
    CompactionTrigger,
    compaction_decision,
)
from guestagent.ops.workingset.policy import ReclaimPolicy
from guestagent.sizes import MIB
from tests.fakes.root import make_fake_root
from tests.fakes.taskstats import FakeTaskstats, put_procs

PAGE = 4096


def blocks(small_pages: int, huge_blocks: int) -> tuple[int, ...]:
    return (small_pages, 0, 0, 0, 0, 0, 0, 0, 0, huge_blocks, 0)


@pytest.mark.parametrize(
    ("free", "stall", "since", "run", "why"),
    [
        (blocks(64 * 256, 4), 0, None, True, "64 MiB of 72 MiB free"),
        (blocks(64 * 256, 4), 0, 10.0, False, "ran 10 s ago"),
        (blocks(64 * 256, 4), 5000, 100.0, False, "system stall 5000 us"),
        (blocks(16 * 256, 0), 0, None, False, "not worth it"),  # Too little to gain.
        (blocks(31 * 256, 100), 0, None, False, "not worth it"),
        (blocks(32 * 256, 400), 0, None, True, "32 MiB of 832 MiB"),  # Whatever its share.
        ((), 0, None, False, "not worth it"),
    ],
)
def test_compaction_when_it_pays(
    free: tuple[int, ...], stall: int, since: float | None, run: bool, why: str
) -> None:
    decided, reason = compaction_decision(free, PAGE, stall, 1000, since, CompactionRule())
    assert decided is run
    assert why in reason


@pytest.mark.parametrize(
    ("since", "reclaimed", "reclaiming", "run", "why"),
    [
        (15.0, 64 * MIB, False, True, "64 MiB reclaimed since the last run"),
        (15.0, 64 * MIB, True, False, "at most every 60 s"),  # Still reclaiming: wait.
        (15.0, 16 * MIB, False, False, "at most every 60 s"),  # Too little freed since.
        (5.0, 64 * MIB, False, False, "at most every 10 s"),
    ],
)
def test_compaction_soon_after_reclaim_settles(
    since: float, reclaimed: int, reclaiming: bool, run: bool, why: str
) -> None:
    decided, reason = compaction_decision(
        blocks(64 * 256, 4), PAGE, 0, 1000, since, CompactionRule(), reclaimed, reclaiming
    )
    assert decided is run
    assert why in reason


@pytest.mark.parametrize(
    ("small_mib", "reclaimed", "run"),
    [
        (30, 380 * MIB, True),  # Under the standing bar, over the bar after a burst.
        (8, 380 * MIB, True),
        (7, 380 * MIB, False),
        (30, 0, False),  # No burst since: the standing 32 MiB bar.
    ],
)
def test_after_a_burst_less_stranded_memory_is_worth_a_compaction(
    small_mib: int, reclaimed: int, run: bool
) -> None:
    decided, reason = compaction_decision(
        blocks(small_mib * 256, 300), PAGE, 0, 1000, 100.0, CompactionRule(), reclaimed, False
    )
    assert decided is run, reason


def test_without_psi_the_calm_bar_is_delay_accountings_stall(tmp_path: Path) -> None:
    """The whole guest's stall from delay accounting decides where there is no PSI: calm, it
    compacts; stalled over the bar, it waits, saying so."""
    fake = make_fake_root(tmp_path / "root", psi=False)
    fake.write("proc/sys/kernel/task_delayacct", "1\n")
    fake.write("proc/buddyinfo", "Node 0, zone   Normal  40000 20000 100 10 0 0 0 0 0 0 0\n")
    fake.write("proc/sys/vm/compact_memory", "")
    fake.write("proc/vmstat", "compact_stall 0\n")
    put_procs(fake.root / "sys/fs/cgroup", 1)
    kernel, now = FakeTaskstats({1: 0}), [1000.0]
    meter = DelayStallMeter(fake.fs, kernel, lambda: now[0])
    trigger = CompactionTrigger(fake.fs, lambda: now[0], PAGE, None, meter)
    trigger.maybe_compact([ReclaimPolicy()], False)  # The baseline.
    now[0] += 11
    kernel.stall(1, 50_000)  # 50 ms in 11 s, over the bar of 2 ms a second.
    trigger.maybe_compact([ReclaimPolicy()], False)
    assert trigger.status.runs == 0 and "system stall 50000 us over 22000 us" in (
        trigger.status.last_decision
    )
    now[0] += 11
    trigger.maybe_compact([ReclaimPolicy()], False)
    assert trigger.status.runs == 1, trigger.status
    assert (fake.root / "proc/sys/vm/compact_memory").read_text() == "1"


@pytest.mark.parametrize(
    ("small_mib", "left_mib", "reclaimed", "reclaiming", "since", "run", "why"),
    [
        # A run in the burst left 20 MiB; the burst's tail freed 5 MiB and scattered 10 more.
        (30, 20, 5 * MIB, False, 15.0, True, "10 MiB more in small blocks than it left"),
        (27, 20, 5 * MIB, False, 15.0, False, "at most every 60 s"),  # 7 MiB more: not yet.
        (30, 20, 5 * MIB, True, 15.0, False, "at most every 60 s"),  # Still reclaiming.
        (30, 20, 0, False, 15.0, False, "at most every 60 s"),  # Nothing freed since.
        (30, 20, 5 * MIB, False, 5.0, False, "at most every 10 s"),
        (30, None, 5 * MIB, False, None, False, "not worth it"),  # No run yet: 32 MiB bar.
    ],
)
def test_a_run_in_the_middle_of_a_burst_is_followed_by_one_for_its_tail(
    small_mib: int,
    left_mib: int | None,
    reclaimed: int,
    reclaiming: bool,
    since: float | None,
    run: bool,
    why: str,
) -> None:
    left = None if left_mib is None else left_mib * MIB
    decided, reason = compaction_decision(
        blocks(small_mib * 256, 300),
        PAGE,
        0,
        1000,
        since,
        CompactionRule(),
        reclaimed,
        reclaiming,
        left,
    )
    assert decided is run, reason
    assert why in reason


def test_the_trigger_counts_what_is_stranded_after_its_own_run(tmp_path: Path) -> None:
    """What a run could not gather does not count again; what the reclaimer scatters after it
    does, once it pauses. (The fake's compaction moves nothing: a run leaves what it saw.)"""
    fake = make_fake_root(tmp_path / "root")

    def stranded(mib: int) -> None:
        fake.write("proc/buddyinfo", f"Node 0, zone Normal {mib * 256} 0 0 0 0 0 0 0 0 300 0\n")

    fake.write("proc/sys/vm/compact_memory", "")
    fake.write("proc/vmstat", "compact_stall 0\n")
    now = [1000.0]
    trigger = CompactionTrigger(fake.fs, lambda: now[0], PAGE)
    policies = [ReclaimPolicy()]

    def check(reclaimed_mib: int, mib: int) -> int:
        trigger.reclaimed(reclaimed_mib * MIB)
        stranded(mib)
        now[0] += 11
        trigger.maybe_compact(policies, False)
        return trigger.status.runs

    stranded(26)
    trigger.maybe_compact(policies, True)  # The baseline.
    assert check(64, 26) == 1  # A burst's end: 26 MiB stranded, over the 8 MiB bar.
    assert check(4, 30) == 1, trigger.status  # 4 MiB more than the run left: not yet.
    assert check(0, 35) == 2, trigger.status  # 9 MiB more: the tail is worth a run...
    assert "9 MiB more in small blocks than it left" in trigger.status.last_decision
    assert check(4, 35) == 2, trigger.status  # ... once: what it could not move stays out.
