"""When the give-back scenarios take the agent's cold count as the whole set's: counted in
two aging rounds in a row, not at the first step of a count that climbs."""

from __future__ import annotations

from guestagent.sizes import MIB
from tests.workloads.cold_count import ColdReading, count_held

SET = 400 * MIB
ROUND_NS = 10 * 1_000_000_000


def reading(round_: int, cgroup_mib: float) -> ColdReading:
    return ColdReading(round_ * ROUND_NS, int(cgroup_mib * MIB), 0)


def test_the_failed_runs_first_step_is_not_the_set() -> None:
    # CI 2026-12-06: the give-back read 340.5 MiB of the 400 counted, the next round more.
    assert not count_held(reading(4, 340.5), reading(5, 402.5), SET)


def test_a_count_that_held_across_a_round_is_the_set() -> None:
    assert count_held(reading(5, 402.5), reading(6, 402.5), SET)
    assert count_held(reading(5, 340.5), reading(6, 340.5 + 8), SET)


def test_two_reads_of_one_round_say_nothing_of_the_next() -> None:
    assert not count_held(reading(5, 402.5), reading(5, 402.5), SET)


def test_a_count_below_the_fraction_is_not_held_however_steady() -> None:
    assert not count_held(reading(5, 300), reading(6, 300), SET)
    assert not count_held(reading(5, 300), reading(6, 345), SET)


def test_growth_past_the_tolerance_is_not_held() -> None:
    assert not count_held(reading(5, 350), reading(6, 350 + 8.1), SET)
