"""Shared readings: one read for every caller that takes it as fresh enough, errors kept by none."""

from __future__ import annotations

import threading

import pytest

from guestagent.ops.shared_reads import SharedReads


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def counting(clock: Clock) -> tuple[SharedReads[str, int], list[str]]:
    reads: list[str] = []

    def read(key: str) -> int:
        reads.append(key)
        return len(reads)

    return SharedReads(read, keep_s=10.0, clock=clock), reads


def test_a_reading_started_since_fresh_from_is_shared() -> None:
    clock = Clock()
    shared, reads = counting(clock)
    assert shared.get("a", fresh_from=99.0) == 1
    clock.now = 100.05
    assert shared.get("a", fresh_from=100.0) == 1  # Started at 100.0: fresh enough.
    assert shared.get("a", fresh_from=100.01) == 2  # Started before: read again.
    assert reads == ["a", "a"]


def test_keys_are_read_apart() -> None:
    clock = Clock()
    shared, reads = counting(clock)
    assert (shared.get("a", 0.0), shared.get("b", 0.0), shared.get("a", 0.0)) == (1, 2, 1)
    assert reads == ["a", "b"]


def test_callers_during_a_read_wait_for_it_and_share_it() -> None:
    started, release = threading.Event(), threading.Event()
    reads = []

    def slow(key: str) -> str:
        reads.append(key)
        started.set()
        release.wait(5)
        return f"read {len(reads)}"

    shared: SharedReads[str, str] = SharedReads(slow, keep_s=10.0)
    results: list[str] = []
    first = threading.Thread(target=lambda: results.append(shared.get("k", 0.0)))
    first.start()
    assert started.wait(5)
    others = [
        threading.Thread(target=lambda: results.append(shared.get("k", 0.0))) for _ in range(5)
    ]
    for thread in others:
        thread.start()
    release.set()
    for thread in (first, *others):
        thread.join(5)
    assert results == ["read 1"] * 6 and reads == ["k"]


def test_a_read_under_way_that_started_too_early_is_not_joined() -> None:
    started, release = threading.Event(), threading.Event()
    clock = Clock()
    reads = []

    def slow(key: str) -> int:
        reads.append(clock.now)
        if len(reads) == 1:
            started.set()
            release.wait(5)
        return len(reads)

    shared: SharedReads[str, int] = SharedReads(slow, keep_s=10.0, clock=clock)
    first = threading.Thread(target=lambda: shared.get("k", 0.0))
    first.start()
    assert started.wait(5)
    clock.now = 101.0  # Something changed after the first read began: it cannot show it.
    assert shared.get("k", fresh_from=100.5) == 2
    release.set()
    first.join(5)
    assert reads == [100.0, 101.0]
    # The later reading is the one kept, though the earlier one ended after it.
    assert shared.get("k", fresh_from=100.5) == 2


def test_an_error_reaches_every_waiter_and_is_kept_by_none() -> None:
    started, release = threading.Event(), threading.Event()
    calls = []

    def failing(key: str) -> int:
        calls.append(key)
        if len(calls) == 1:
            started.set()
            release.wait(5)
            raise OSError("gone")
        return 7

    shared: SharedReads[str, int] = SharedReads(failing, keep_s=10.0)
    errors: list[BaseException] = []

    def get() -> None:
        try:
            shared.get("k", 0.0)
        except OSError as e:
            errors.append(e)

    first = threading.Thread(target=get)
    first.start()
    assert started.wait(5)
    second = threading.Thread(target=get)
    second.start()
    release.set()
    first.join(5)
    second.join(5)
    assert [str(e) for e in errors] == ["gone", "gone"]
    assert shared.get("k", 0.0) == 7  # Read afresh: the failure was not kept.


def test_readings_past_keep_are_dropped() -> None:
    clock = Clock()
    shared, _ = counting(clock)
    shared.get("old", 0.0)
    clock.now += 11
    shared.get("new", 0.0)  # The sweep runs with a read, at most once per keep_s.
    assert len(shared) == 1


@pytest.mark.parametrize("fresh_from", [float("-inf"), 100.0])
def test_the_first_ask_always_reads(fresh_from: float) -> None:
    shared, reads = counting(Clock())
    shared.get("k", fresh_from)
    assert reads == ["k"]
