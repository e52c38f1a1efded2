"""The reclaimer scenarios' windows: where the no-thrash scenario's late window may start (the
crossing into the hot set, and once the reclaimer has settled at it), and the stall bound a
slow guest is held to."""

from __future__ import annotations

from typing import Any

import pytest

from guestagent.ops.workingset.policy import ControllerState, ReclaimPolicy, Sample, decide
from guestagent.sizes import MIB
from tests.workloads.reclaim import (
    SETTLED_HOLD,
    STALL_TARGET_US,
    assert_cold_evicted_bounds,
    assert_off_then_on_bounds,
    first_stall_over_target,
    holding_settled,
    paced_stall_bound,
    settled_after,
)


def rows(*stalls_us: int | None, step_s: float = 1.0) -> list[dict[str, Any]]:
    """Sampler rows a step apart whose stall counter grows by each given amount."""
    out: list[dict[str, Any]] = [{"t": 0.0, "stall_total_us": 0}]
    for stall in stalls_us:
        last = out[-1]["stall_total_us"]
        total = None if stall is None or last is None else last + stall
        out.append({"t": out[-1]["t"] + step_s, "stall_total_us": total})
    return out


def test_no_interval_over_the_target_means_no_crossing() -> None:
    assert first_stall_over_target(rows(0, STALL_TARGET_US, 500)) is None


def test_the_crossing_is_where_the_first_interval_over_the_target_ends() -> None:
    # The CI run that placed it late: one interval of 61.8 ms, 26 s after the policy went on.
    assert first_stall_over_target(rows(0, 0, 61_844, 0, 3_000)) == 3.0


def test_the_rate_not_the_amount_decides() -> None:
    assert first_stall_over_target(rows(3_000, step_s=2.0)) is None  # 1500 us/s.
    assert first_stall_over_target(rows(5_000, step_s=2.0)) == 2.0  # 2500 us/s.


def test_an_unread_signal_is_no_crossing() -> None:
    assert first_stall_over_target(rows(None, None)) is None


def reasons_of_back_offs_in_a_row(count: int) -> list[str]:
    """The reasons policy.decide gives, interval by interval, as each probe after a hold is
    over the stall target `count` times in a row: the back-off, then the hold counting down."""
    policy, state = ReclaimPolicy(), ControllerState()
    over = Sample(stall_us=50_000, refault_bytes=0, current=400 * MIB, protected=0)
    quiet = Sample(stall_us=0, refault_bytes=0, current=400 * MIB, protected=0)
    reasons: list[str] = []
    for _ in range(count):
        state = decide(over, policy, state, 4096).state
        reasons.append(state.why)
        while state.hold > 0:
            state = decide(quiet, policy, state, 4096).state
            reasons.append(state.why)
        state = decide(quiet, policy, state, 4096).state  # The next probe.
        reasons.append(state.why)
    return reasons


def test_the_first_two_back_offs_are_not_settled_the_third_is() -> None:
    assert not any(holding_settled(r) for r in reasons_of_back_offs_in_a_row(2))
    third = reasons_of_back_offs_in_a_row(3)
    settled = [holding_settled(r) for r in third]
    # Holds of 1 and 4 and their probes, then the back-off that holds 16.
    first = settled.index(True)
    assert third[first].endswith(f"holding {SETTLED_HOLD} interval(s)")
    assert not any(settled[:first])


def test_a_hold_of_16_seen_part_way_is_settled_a_hold_of_4_never_is() -> None:
    # A sampler a little slower than the intervals may miss the row where the hold began.
    assert holding_settled("holding after a back-off, 12 interval(s) left")
    assert holding_settled("holding after a back-off, 4 interval(s) left")
    assert not holding_settled("holding after a back-off, 3 interval(s) left")
    assert not holding_settled("slack 1.00: reclaiming 4096 B of 419430400 B (floor 0 B)")
    assert not holding_settled("")


def test_the_late_window_starts_when_settled_after_the_crossing() -> None:
    # The CI run of 2026-12-06 (apple kernel, 2.51x): a crossing at 69.2 s, two more probes
    # over the target, then the hold of 16 at 80.1 s.
    timeline = [
        (67.7, "slack 1.00: reclaiming 1048576 B of 419430400 B (floor 0 B)"),
        (69.2, "stall 25469 us over target 2000 us; holding 1 interval(s)"),
        (73.3, "stall 129454 us over target 2000 us; holding 4 interval(s)"),
        (74.6, "holding after a back-off, 3 interval(s) left"),
        (80.1, "stall 28914 us over target 2000 us; holding 16 interval(s)"),
        (81.5, "holding after a back-off, 15 interval(s) left"),
    ]
    rows = [{"t": t, "reason": reason} for t, reason in timeline]
    assert settled_after(rows, 69.2) == 80.1
    assert settled_after(rows[:4], 69.2) is None  # Not yet settled: the window waits.


def test_a_settled_hold_before_the_crossing_does_not_start_the_window() -> None:
    rows = [
        {"t": 10.0, "reason": "stall 9000 us over target 2000 us; holding 16 interval(s)"},
        {"t": 40.0, "reason": "stall 9000 us over target 2000 us; holding 1 interval(s)"},
    ]
    assert settled_after(rows, 40.0) is None


def test_the_stall_bound_is_the_target_at_an_idle_pace_and_grows_with_a_slower_one() -> None:
    assert paced_stall_bound({}, 1.0) == STALL_TARGET_US
    assert paced_stall_bound({}, 0.5) == STALL_TARGET_US  # Never tighter than the target.
    assert paced_stall_bound({}, 2.43) == round(STALL_TARGET_US * 2.43)


def off_then_on_figures(stall_us_per_s: int) -> dict[str, Any]:
    """An off-then-on run within every bound but, perhaps, the stall."""
    return {
        "control_returned_fraction": 0.0,
        "seconds_to_80_percent": 68.3,
        "swap_file_allocated_mib": 364.0,
        "oom_kills": 0,
        "hot_slowdown_paced": 1.0,
        "stall_us_per_s_on": stall_us_per_s,
    }


def test_off_then_on_holds_the_stall_to_the_bound_at_the_guests_pace() -> None:
    # The CI run (2026-12-06) of the apple kernel's guest at 2.43x: 2463 us/s.
    figures = off_then_on_figures(2463)
    assert_off_then_on_bounds(figures, 2.43)
    assert figures["stall_bound_us_per_s"] == 4860
    with pytest.raises(AssertionError):
        assert_off_then_on_bounds(off_then_on_figures(2463), 1.0)
    with pytest.raises(AssertionError):
        assert_off_then_on_bounds(off_then_on_figures(4861), 2.43)


def test_with_ages_the_cold_set_must_go_by_eviction_and_soon() -> None:
    figures = {**off_then_on_figures(0), "evicted_cold_mib": 558.7, "seconds_to_80_percent": 12.4}
    assert_cold_evicted_bounds(figures, 1.0)
    with pytest.raises(AssertionError):  # Probing alone's pace, 2026-12-04.
        assert_cold_evicted_bounds({**figures, "seconds_to_80_percent": 39.6}, 1.0)
    assert_cold_evicted_bounds({**figures, "seconds_to_80_percent": 39.6}, 1.4)
    with pytest.raises(AssertionError):  # Fast, but by probing.
        assert_cold_evicted_bounds({**figures, "evicted_cold_mib": 3.5}, 1.0)
