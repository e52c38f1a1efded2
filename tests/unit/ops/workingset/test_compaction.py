from __future__ import annotations

import pytest

from guestagent.ops.workingset.compaction import CompactionRule, compaction_decision
from guestagent.ops.workingset.policy import MIB

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
        (blocks(48 * 256, 100), 0, None, False, "not worth it"),  # Mostly in 2 MiB blocks.
        (blocks(64 * 256, 100), 0, None, True, "64 MiB of 264 MiB"),  # But 64 MiB stranded.
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
