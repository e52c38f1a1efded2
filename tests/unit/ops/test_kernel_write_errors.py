"""A failed write to a kernel file in reclaim, compaction and hotplug is a domain error
naming the file, the value and the errno, never an OSError that would reach the caller as
INTERNAL."""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest

from guestagent.errors import Aborted, FailedPrecondition
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.ops.compaction import Compactor
from guestagent.ops.hotplug import OnlinePolicy, online_memory
from guestagent.ops.reclaim import ReclaimSpec, reclaim
from tests.fakes.root import FakeRoot


def failing_os_write(monkeypatch: pytest.MonkeyPatch, number: int) -> None:
    def write(fd: int, data: Any) -> int:
        raise OSError(number, os.strerror(number))

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize(
    ("number", "expected"), [(errno.EBUSY, FailedPrecondition), (errno.EINTR, Aborted)]
)
def test_reclaim(
    fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch, number: int, expected: type[Exception]
) -> None:
    control = fake_root.add_cgroup("c") / "memory.reclaim"
    control.write_text("")
    failing_os_write(monkeypatch, number)
    with pytest.raises(expected) as raised:
        reclaim(fake_root.fs, ReclaimSpec(cgroup_name("c"), 1 << 20))
    assert str(raised.value).startswith(f"write '1048576' to {control}: {errno.errorcode[number]}")


def test_reclaim_drop_caches(fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    (fake_root.add_cgroup("c") / "memory.reclaim").write_text("")
    fake_root.write("proc/sys/vm/drop_caches", "")
    failing_os_write(monkeypatch, errno.EACCES)
    with pytest.raises(FailedPrecondition, match=r"write '3' to .*drop_caches: EACCES"):
        reclaim(fake_root.fs, ReclaimSpec(cgroup_name("c"), 1 << 20, drop_caches=3))


async def test_compaction(fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_root.write("proc/buddyinfo", "Node 0, zone DMA32 1 1 1 1 1 1 1 1 1 1 1\n")
    fake_root.write("proc/vmstat", "compact_stall 0\n")
    fake_root.write("proc/sys/vm/compact_memory", "")
    failing_os_write(monkeypatch, errno.EPERM)
    with pytest.raises(FailedPrecondition, match=r"write '1' to .*compact_memory: EPERM"):
        await Compactor(fake_root.fs).compact(None, 5)


def test_hotplug_names_each_refused_block(
    fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_root.write("sys/devices/system/memory/block_size_bytes", "8000000\n")
    state = fake_root.write("sys/devices/system/memory/memory8/state", "offline\n")
    failing_os_write(monkeypatch, errno.EBUSY)
    result = online_memory(fake_root.fs, OnlinePolicy("online"))
    assert result.failed == (
        f"memory8: write 'online' to {state}: EBUSY (Device or resource busy)",
    )
