"""The WatchMemory loop over domain values: reasons, interval rules, the end on shutdown."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from guestagent.agent.watch_stream import (
    WatchReason,
    WatchSpec,
    reason_for,
    trigger_to_arm,
    watch_interval_seconds,
    watch_memory,
)
from guestagent.errors import FailedPrecondition, InvalidArgument, NotFound
from guestagent.linux.features import PSI, Absent
from guestagent.linux.fs import KernelFS
from guestagent.linux.watch import PressureTriggerSpec, Signal
from tests.fakes.root import FakeRoot, make_fake_root

NO_PSI = Absent(PSI, "the kernel was booted with psi=0; boot with psi=1 instead")
ASKED = PressureTriggerSpec(100_000, 1_000_000)


@pytest.mark.parametrize(
    ("spec", "psi", "armed"),
    [
        (WatchSpec(), None, PressureTriggerSpec()),  # The default trigger, with PSI.
        (WatchSpec(trigger=ASKED, trigger_asked=True), None, ASKED),
        (WatchSpec(), NO_PSI, None),  # No PSI: no default trigger; interval and events stay.
    ],
)
def test_trigger_to_arm(
    spec: WatchSpec, psi: Absent | None, armed: PressureTriggerSpec | None
) -> None:
    assert trigger_to_arm(spec, psi) == armed


def test_a_trigger_asked_for_without_psi_is_refused_saying_why() -> None:
    with pytest.raises(
        FailedPrecondition, match=r"pressure_trigger set, but there is no PSI: .*psi=0"
    ):
        trigger_to_arm(WatchSpec(trigger=ASKED, trigger_asked=True), NO_PSI)


async def test_without_psi_the_watch_runs_on_its_interval(tmp_path: Path) -> None:
    fake = make_fake_root(tmp_path / "root", psi=False)
    fake.add_cgroup("pod", psi=False)
    fs = KernelFS(fake.root)
    stopping = asyncio.Event()
    updates = watch_memory(fs, WatchSpec(("pod",), interval_s=0.05), stopping)
    first = await anext(updates)
    assert first.report.pressure is None and first.report.cgroups[0].pressure is None
    assert [a.feature for a in first.report.absent][:1] == [PSI]
    assert (await anext(updates)).reason == WatchReason.INTERVAL
    stopping.set()
    with pytest.raises(StopAsyncIteration):
        await anext(updates)
    asked = watch_memory(fs, WatchSpec(trigger=ASKED, trigger_asked=True), stopping)
    with pytest.raises(FailedPrecondition, match="no PSI"):
        await anext(asked)


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
