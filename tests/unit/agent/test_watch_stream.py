"""The WatchMemory loop over domain values: reasons, interval rules, the end on shutdown."""

from __future__ import annotations

import asyncio

import pytest

from guestagent.agent.watch_stream import (
    WatchReason,
    WatchSpec,
    reason_for,
    watch_interval_seconds,
    watch_memory,
)
from guestagent.errors import InvalidArgument, NotFound
from guestagent.linux.watch import Signal
from tests.fakes.root import FakeRoot


@pytest.mark.parametrize(
    ("woke", "reason", "changed"),
    [
        ([], WatchReason.INTERVAL, ()),
        ([(Signal.PRESSURE, None)], WatchReason.PRESSURE, ()),
        (
            [(Signal.MEMORY_EVENTS, "b"), (Signal.PRESSURE, None), (Signal.MEMORY_EVENTS, "a")],
            WatchReason.MEMORY_EVENTS,
            ("a", "b"),
        ),
        (
            [(Signal.MEMORY_EVENTS, "a"), (Signal.MEMORY_EVENTS, "a")],
            WatchReason.MEMORY_EVENTS,
            ("a",),
        ),
    ],
)
def test_reason_for(
    woke: list[tuple[Signal, str | None]], reason: WatchReason, changed: tuple[str, ...]
) -> None:
    assert reason_for(woke) == (reason, changed)


def test_watch_interval() -> None:
    assert watch_interval_seconds(0) == 1.0
    assert watch_interval_seconds(100) == 0.1
    with pytest.raises(InvalidArgument, match="99 ms is below the minimum 100 ms"):
        watch_interval_seconds(99)


async def test_initial_then_interval_then_ends_on_shutdown(fake_root: FakeRoot) -> None:
    fake_root.add_cgroup("pod")
    stopping = asyncio.Event()
    stream = watch_memory(fake_root.fs, WatchSpec(("pod",), interval_s=0.1), stopping)
    first = await anext(stream)
    assert first.reason is WatchReason.INITIAL
    assert [c.path for c in first.report.cgroups] == ["pod"]
    assert (await anext(stream)).reason is WatchReason.INTERVAL
    stopping.set()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), 5)


async def test_a_missing_cgroup_fails_before_anything_is_sent(fake_root: FakeRoot) -> None:
    stream = watch_memory(fake_root.fs, WatchSpec(("gone",)), asyncio.Event())
    with pytest.raises(NotFound, match="gone"):
        await anext(stream)
