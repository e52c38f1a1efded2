"""The VM tests' waiting helpers, without a VM: what they return, and what a timeout says."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.vm.guest import wait_until, wait_until_steady
from tests.vm.pace import IDLE_PROBE_SECONDS, MAX_FACTOR, Pace, pace_from


@pytest.mark.parametrize(
    ("runs", "factor"),
    [
        ([IDLE_PROBE_SECONDS / 2] * 3, 1.0),  # faster than the reference: never below 1
        ([IDLE_PROBE_SECONDS * 3, IDLE_PROBE_SECONDS * 3, 99.0], 3.0),  # one stall is ignored
        ([IDLE_PROBE_SECONDS * 1000] * 3, MAX_FACTOR),
    ],
)
def test_pace_is_the_median_against_idle_within_bounds(runs: list[float], factor: float) -> None:
    assert pace_from(runs).factor == factor


def test_pace_scales_idle_deadlines() -> None:
    assert Pace(factor=2.5, probe_seconds=0.3).scale(60) == 150


def test_wait_until_returns_the_first_true_value() -> None:
    values: Iterator[object] = iter([None, 0, [], "found"])
    assert wait_until(lambda: next(values), 5, "a value", every=0.001) == "found"


def test_wait_until_names_what_it_waited_for_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the disk to go \(last: 0\)"):
        wait_until(lambda: 0, 0.01, "the disk to go", every=0.001)


def test_steady_waits_for_done_and_for_two_close_readings() -> None:
    # Falls by 50 a reading to 100, then holds; done() asks for at most 200.
    readings = itertools.chain([400, 350, 300, 250, 200, 150, 100], itertools.repeat(100))
    value = wait_until_steady(
        lambda: next(readings), 5, "RSS", tolerance=10, window=0.001, done=lambda v: v <= 200
    )
    assert value == 100


def test_steady_timeout_shows_the_last_readings() -> None:
    counter = itertools.count(0, 100)
    with pytest.raises(AssertionError, match=r"waiting for RSS to settle .*last readings \["):
        wait_until_steady(lambda: next(counter), 0.01, "RSS to settle", tolerance=1, window=0.001)
