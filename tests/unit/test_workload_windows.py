"""The reclaimer scenarios' windows: where the no-thrash scenario's late window may start, and
the stall bound a slow guest is held to."""

from __future__ import annotations

from typing import Any

import pytest

from tests.workloads.reclaim import (
    STALL_TARGET_US,
    assert_off_then_on_bounds,
    first_stall_over_target,
    paced_stall_bound,
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
