import asyncio
import os
import struct
from pathlib import Path

import pytest

from guestagent.errors import InvalidArgument
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.linux.watch import (
    PressureTriggerSpec,
    Signal,
    SignalHub,
    parse_inotify_events,
    pressure_trigger_spec,
)
from tests.fakes.root import FakeRoot, make_fake_root


def test_default_trigger_line() -> None:
    assert PressureTriggerSpec().line() == b"some 150000 1000000\0"
    assert pressure_trigger_spec(0, 0, True).line() == b"full 150000 1000000\0"


@pytest.mark.parametrize(
    ("stall", "window", "reason"),
    [
        (100, 100_000, "outside"),
        (100, 20_000_000, "outside"),
        (0, 1_000_000, "above 0"),
        (1_000_000, 1_000_000, "below window"),
    ],
)
def test_trigger_refusals(stall: int, window: int, reason: str) -> None:
    with pytest.raises(InvalidArgument, match=reason):
        pressure_trigger_spec(stall, window, False)


def test_parse_inotify_events_walks_names() -> None:
    header = struct.Struct("iIII")
    data = header.pack(3, 2, 0, 16) + b"name".ljust(16, b"\0") + header.pack(5, 2, 0, 0)
    assert parse_inotify_events(data) == [(3, 2, "name"), (5, 2, "")]


async def test_memory_events_change_is_signalled(fake_root: FakeRoot) -> None:
    events = fake_root.add_cgroup("pod") / "memory.events"
    with SignalHub(fake_root.fs).subscribe({cgroup_name("pod"): str(events)}, None) as signals:
        events.write_text("oom 1\n")
        signal = await asyncio.wait_for(signals.queue.get(), timeout=5)
    assert signal == (Signal.MEMORY_EVENTS, "pod")


async def test_pressure_trigger_on_a_plain_file_falls_back_quietly(fake_root: FakeRoot) -> None:
    # A regular file cannot be polled for POLLPRI: the watch must run on its interval.
    fake_root.write("proc/pressure/memory", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    with SignalHub(fake_root.fs).subscribe({}, PressureTriggerSpec()) as signals:
        assert signals.queue.empty()


async def test_no_psi_in_the_kernel_means_no_trigger(tmp_path: Path) -> None:
    fake = make_fake_root(tmp_path / "root", psi=False)
    with SignalHub(fake.fs).subscribe({}, PressureTriggerSpec()) as signals:
        assert signals.queue.empty()


async def test_a_pressure_file_outside_proc_is_refused(tmp_path: Path) -> None:
    fake = make_fake_root(tmp_path / "root", psi=False)
    elsewhere = fake.write("elsewhere/memory", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    os.symlink(elsewhere.parent, fake.root / "proc" / "pressure")
    with pytest.raises(InvalidArgument, match="outside its mount"):
        SignalHub(fake.fs).subscribe({}, PressureTriggerSpec())
