"""The WatchMemory loop over domain values: reasons, interval rules, the end on shutdown."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from guestagent.agent.watch_stream import (
    Triggers,
    WatchReason,
    WatchSpec,
    next_tick,
    reason_for,
    triggers_to_arm,
    watch_interval_seconds,
    watch_memory,
)
from guestagent.errors import FailedPrecondition, InvalidArgument, NotFound
from guestagent.linux import meminfo
from guestagent.linux.cgroup.memory import CgroupMemory, MemoryCgroup
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.linux.delayacct import DelayStallMeter
from guestagent.linux.features import DELAYACCT, PSI, Absent
from guestagent.linux.kernel import Kernel
from guestagent.linux.watch import PressureTriggerSpec, Signal, SignalHub
from tests.fakes.root import MEMORY_EVENTS, FakeRoot, make_fake_root
from tests.fakes.taskstats import FakeTaskstats, put_procs

NO_PSI = Absent(PSI, "the kernel was booted with psi=0; boot with psi=1 instead")
NO_DELAYACCT = Absent(DELAYACCT, "delay accounting is off (kernel.task_delayacct 0)")
ASKED = PressureTriggerSpec(100_000, 1_000_000)
ASKED_SPEC = WatchSpec(trigger=ASKED, trigger_asked=True)


@pytest.mark.parametrize(
    ("spec", "psi", "delay", "armed"),
    [
        (WatchSpec(), None, None, Triggers(psi=PressureTriggerSpec())),  # The default, with PSI.
        (ASKED_SPEC, None, NO_DELAYACCT, Triggers(psi=ASKED)),
        # No PSI: no default trigger (the interval and events stay), whatever else there is.
        (WatchSpec(), NO_PSI, None, Triggers()),
        (WatchSpec(), NO_PSI, NO_DELAYACCT, Triggers()),
        # No PSI, one asked for: delay accounting serves it.
        (ASKED_SPEC, NO_PSI, None, Triggers(delayacct=ASKED)),
    ],
)
def test_triggers_to_arm(
    spec: WatchSpec, psi: Absent | None, delay: Absent | None, armed: Triggers
) -> None:
    assert triggers_to_arm(spec, psi, delay) == armed


def test_a_trigger_asked_for_without_any_stall_signal_is_refused_naming_both() -> None:
    with pytest.raises(
        FailedPrecondition,
        match=r"no stall signal: no PSI: .*psi=0.*; no delay accounting: .*task_delayacct 0",
    ):
        triggers_to_arm(ASKED_SPEC, NO_PSI, NO_DELAYACCT)


def test_a_full_trigger_without_psi_is_refused_saying_only_psi_measures_it() -> None:
    full = WatchSpec(trigger=PressureTriggerSpec(100_000, 1_000_000, full=True), trigger_asked=True)
    with pytest.raises(FailedPrecondition, match="full stalls, which only PSI measures"):
        triggers_to_arm(full, NO_PSI, None)


async def test_without_psi_the_watch_runs_on_its_interval(tmp_path: Path) -> None:
    fake = make_fake_root(tmp_path / "root", psi=False)
    fake.add_cgroup("pod", psi=False)
    fs = Kernel(fake.root)
    stopping = asyncio.Event()
    updates = watch_memory(fs, WatchSpec((cgroup_name("pod"),), interval_s=0.05), stopping)
    first = await anext(updates)
    assert first.answer.report.pressure is None and first.answer.report.cgroups[0].pressure is None
    assert [a.feature for a in first.answer.report.absent][:1] == [PSI]
    assert (await anext(updates)).reason == WatchReason.INTERVAL
    stopping.set()
    with pytest.raises(StopAsyncIteration):
        await anext(updates)
    asked = watch_memory(fs, WatchSpec(trigger=ASKED, trigger_asked=True), stopping)
    with pytest.raises(FailedPrecondition, match=r"no PSI.*no delay accounting"):
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


@pytest.mark.parametrize(
    ("after", "interval", "tick"),
    [
        (10.05, 0.2, 10.2),
        (10.25, 0.25, 10.5),  # Never the tick it is at.
        (10.25 - 1e-9, 0.25, 10.25),
        (0.0, 1.0, 1.0),
        (59.999, 60.0, 60.0),
    ],
)
def test_next_tick_is_the_interval_grid_strictly_after(
    after: float, interval: float, tick: float
) -> None:
    assert next_tick(after, interval) == pytest.approx(tick)
    assert next_tick(after, interval) > after


async def test_streams_of_one_interval_tick_together(fake_root: FakeRoot) -> None:
    """Opened at different times, they send their interval messages at the same ticks, so
    one reading of the kernel's files serves them all."""
    fake_root.add_cgroup("pod")
    stopping = asyncio.Event()
    spec = WatchSpec((cgroup_name("pod"),), interval_s=0.1)
    first = watch_memory(fake_root.fs, spec, stopping)
    await anext(first)
    await asyncio.sleep(0.037)
    second = watch_memory(fake_root.fs, spec, stopping)
    await anext(second)
    one, other = await asyncio.gather(anext(first), anext(second))
    assert one.reason is other.reason is WatchReason.INTERVAL
    gap_ns = abs(one.answer.report.collected_at_unix_ns - other.answer.report.collected_at_unix_ns)
    assert gap_ns < 30_000_000  # Within 30 ms of each other; opened 37 ms apart.
    stopping.set()


async def test_initial_then_interval_then_ends_on_shutdown(fake_root: FakeRoot) -> None:
    fake_root.add_cgroup("pod")
    stopping = asyncio.Event()
    stream = watch_memory(fake_root.fs, WatchSpec((cgroup_name("pod"),), interval_s=0.1), stopping)
    first = await anext(stream)
    assert first.reason is WatchReason.INITIAL
    assert [c.path for c in first.answer.report.cgroups] == ["pod"]
    assert (await anext(stream)).reason is WatchReason.INTERVAL
    stopping.set()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), 5)


async def test_a_missing_cgroup_fails_before_anything_is_sent(fake_root: FakeRoot) -> None:
    stream = watch_memory(fake_root.fs, WatchSpec((cgroup_name("gone"),)), asyncio.Event())
    with pytest.raises(NotFound, match="gone"):
        await anext(stream)


def recreate(fake_root: FakeRoot, name: str) -> None:
    """A cgroup made again with all its files at once, as cgroupfs's mkdir does: made aside and
    moved in (IN_MOVED_TO, as a cgroup renamed to the name would be)."""
    fake_root.add_cgroup(f"staging/{name}")
    cgroups = fake_root.root / "sys/fs/cgroup"
    (cgroups / f"staging/{name}").rename(cgroups / name)


async def test_a_removed_cgroup_is_reported_and_the_stream_goes_on(fake_root: FakeRoot) -> None:
    fake_root.add_cgroup("pod/a")
    fake_root.add_cgroup("pod/b")
    cgroups = fake_root.root / "sys/fs/cgroup/pod"
    hub = SignalHub(fake_root.fs)
    stopping = asyncio.Event()
    # A long interval: every message after the first is woken by a kernel signal.
    stream = watch_memory(
        fake_root.fs, WatchSpec((cgroup_name("pod/a"), cgroup_name("pod/b")), 60), stopping, hub=hub
    )
    first = await anext(stream)
    assert first.answer.report.removed == ()
    shutil.rmtree(cgroups / "a")  # The container exits: its parent's IN_DELETE wakes the stream.
    gone = await asyncio.wait_for(anext(stream), 5)
    assert (gone.reason, gone.changed) == (WatchReason.MEMORY_EVENTS, ("pod/a",))
    assert gone.answer.report.removed == ("pod/a",)
    assert [c.path for c in gone.answer.report.cgroups] == ["pod/b"]
    assert hub.watched == 2  # Still counted against the caps.
    recreate(fake_root, "pod/a")  # Created again under the same name: that wakes it too.
    back = await asyncio.wait_for(anext(stream), 5)
    assert (back.reason, back.changed, back.answer.report.removed) == (
        WatchReason.MEMORY_EVENTS,
        ("pod/a",),
        (),
    )
    assert [c.path for c in back.answer.report.cgroups] == ["pod/a", "pod/b"]
    (cgroups / "a/memory.events").write_text(MEMORY_EVENTS)  # Watched again.
    again = await asyncio.wait_for(anext(stream), 5)
    assert (again.reason, again.changed) == (WatchReason.MEMORY_EVENTS, ("pod/a",))
    stopping.set()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), 5)
    assert hub.watched == 0


async def test_a_cgroup_gone_between_reads_is_removed_not_an_error(
    fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_root.add_cgroup("pod")
    directory = fake_root.root / "sys/fs/cgroup/pod"
    real = MemoryCgroup.read

    def removed_meanwhile(memory: MemoryCgroup) -> CgroupMemory:
        shutil.rmtree(directory)  # rmdir after the lookup, before the files are read.
        return real(memory)

    monkeypatch.setattr(MemoryCgroup, "read", removed_meanwhile)
    report = meminfo.read_report(fake_root.fs, (cgroup_name("pod"),), removed_ok=True)
    assert (report.cgroups, report.removed) == ((), ("pod",))


async def test_without_ignored_events_the_parent_directory_tells_of_the_removal(
    fake_root: FakeRoot,
) -> None:
    """As on cgroupfs, where a removed file's watch hears nothing (here an open file keeps the
    inode, so no IN_IGNORED comes): the parent directory's watch wakes the stream."""
    fake_root.add_cgroup("pod/a")
    directory = fake_root.root / "sys/fs/cgroup/pod/a"
    hub = SignalHub(fake_root.fs)
    stopping = asyncio.Event()
    stream = watch_memory(fake_root.fs, WatchSpec((cgroup_name("pod/a"),), 60), stopping, hub=hub)
    await anext(stream)
    with (directory / "memory.events").open() as held:
        shutil.rmtree(directory)
        gone = await asyncio.wait_for(anext(stream), 5)
        assert (gone.reason, gone.changed) == (WatchReason.MEMORY_EVENTS, ("pod/a",))
        assert gone.answer.report.removed == ("pod/a",)
        recreate(fake_root, "pod/a")
        back = await asyncio.wait_for(anext(stream), 5)
        assert [c.path for c in back.answer.report.cgroups] == ["pod/a"]
        (directory / "memory.events").write_text(MEMORY_EVENTS)  # The new file is watched.
        woke = await asyncio.wait_for(anext(stream), 5)
        assert (woke.reason, woke.changed) == (WatchReason.MEMORY_EVENTS, ("pod/a",))
        assert held.readable()
    stopping.set()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), 5)
    assert hub.watched == 0 and not hub._parents_by_wd and hub._inotify is None


async def test_without_psi_an_asked_trigger_is_served_by_delay_accounting(tmp_path: Path) -> None:
    fake = make_fake_root(tmp_path / "root", psi=False)
    fake.add_cgroup("pod", psi=False)
    fake.write("proc/sys/kernel/task_delayacct", "1\n")
    put_procs(fake.root / "sys/fs/cgroup", 1)
    put_procs(fake.root / "sys/fs/cgroup/pod", 10)
    fs = Kernel(fake.root)
    kernel = FakeTaskstats({1: 0, 10: 0})
    meter = DelayStallMeter(fs, kernel)
    stopping = asyncio.Event()
    # A 500 ms window is polled every 125 ms; the interval is far off, so only the trigger
    # can wake the stream.
    trigger = PressureTriggerSpec(100_000, 500_000)
    spec = WatchSpec((cgroup_name("pod"),), interval_s=60, trigger=trigger, trigger_asked=True)
    updates = watch_memory(fs, spec, stopping, stall=meter)
    first = await anext(updates)
    assert first.reason == WatchReason.INITIAL
    # No PSI anywhere, so the report carries delay accounting's stall instead, never a zero PSI.
    assert first.answer.report.pressure is None and first.answer.report.delay_stall_us == 0
    assert first.answer.report.cgroups[0].delay_stall_us == 0
    # The poller's first reading (of both processes) is its baseline; the stall comes after.
    polled = kernel.queries + 2
    while kernel.queries < polled:
        await asyncio.sleep(0.01)
    kernel.stall(10, 150_000)
    woke = await asyncio.wait_for(anext(updates), 10)
    assert woke.reason == WatchReason.PRESSURE
    assert woke.answer.report.cgroups[0].delay_stall_us == 150_000
    assert woke.answer.report.delay_stall_us == 150_000
    stopping.set()
    with pytest.raises(StopAsyncIteration):
        await anext(updates)


def test_the_watch_cap_defaults_are_watchs_own() -> None:
    """The daemon's and the command line's defaults are literals, so that start-up need not
    load linux/watch.py for its constant."""
    from guestagent.agent.cli import command_line_options
    from guestagent.agent.daemon import ServerConfig
    from guestagent.linux.watch import DEFAULT_MAX_WATCHES

    assert ServerConfig(listen=()).max_watches == DEFAULT_MAX_WATCHES
    assert command_line_options(["serve"]).max_watches == DEFAULT_MAX_WATCHES
