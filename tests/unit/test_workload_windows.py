"""The reclaimer scenarios' windows: where the no-thrash scenario's late window may start."""

from __future__ import annotations

from typing import Any

from tests.workloads.reclaim import STALL_TARGET_US, first_stall_over_target


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
