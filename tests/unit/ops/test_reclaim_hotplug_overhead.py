import errno
import os

import pytest

from guestagent.errors import FailedPrecondition, InvalidArgument
from guestagent.linux.memblocks import block_size_bytes
from guestagent.ops.overhead import guest_overhead
from guestagent.ops.reclaim import reclaim
from tests.fakes.root import FakeRoot


@pytest.mark.parametrize(
    ("bytes_", "drop", "reason"), [(0, 0, "positive"), (-5, 0, "positive"), (1, 4, "level 4")]
)
def test_reclaim_refusals(fake_root: FakeRoot, bytes_: int, drop: int, reason: str) -> None:
    fake_root.add_cgroup("c")
    with pytest.raises(InvalidArgument, match=reason):
        reclaim(fake_root.fs, "c", bytes_, drop)


def test_reclaim_writes_the_size_and_reports_current(fake_root: FakeRoot) -> None:
    directory = fake_root.add_cgroup("c", current=100)
    (directory / "memory.reclaim").write_text("")
    result = reclaim(fake_root.fs, "c", 64 << 20)
    assert (directory / "memory.reclaim").read_text() == str(64 << 20)
    assert (result.current_before, result.complete) == (100, True)


def test_reclaim_eagain_is_partial(fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = fake_root.add_cgroup("c")
    (directory / "memory.reclaim").write_text("")

    def eagain(fd: int, data: bytes) -> int:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "write", eagain)
    assert not reclaim(fake_root.fs, "c", 1 << 20).complete


def test_reclaim_needs_a_new_kernel(fake_root: FakeRoot) -> None:
    fake_root.add_cgroup("c")
    with pytest.raises(FailedPrecondition, match=r"5\.19"):
        reclaim(fake_root.fs, "c", 1 << 20)


def add_blocks(fake_root: FakeRoot, states: dict[int, str]) -> None:
    fake_root.write("sys/devices/system/memory/block_size_bytes", "8000000\n")
    for index, state in states.items():
        fake_root.write(f"sys/devices/system/memory/memory{index}/state", f"{state}\n")


def test_overhead_figures(fake_root: FakeRoot) -> None:
    add_blocks(fake_root, {0: "online", 1: "online", 2: "online", 3: "online", 4: "offline"})
    fake_root.add_cgroup("pod", current=50 << 20)
    fake_root.write("proc/self/status", "Name:\tpython3\nVmRSS:\t   40960 kB\n")
    overhead = guest_overhead(fake_root.fs, ("pod",))
    assert block_size_bytes(fake_root.fs) == 128 << 20
    assert overhead.present == 4 * (128 << 20)
    assert overhead.mem_total == 498764 * 1024
    assert overhead.kernel_reserved == overhead.present - overhead.mem_total
    used = (498764 - 398100) * 1024
    assert overhead.outside_workloads == used - (50 << 20)
    assert overhead.agent_rss == 40960 * 1024 and overhead.workloads == 50 << 20


def test_present_comes_from_zoneinfo_not_rounded_blocks(fake_root: FakeRoot) -> None:
    # A 306 MiB guest has three 128 MiB blocks online, but only 306 MiB of RAM present.
    add_blocks(fake_root, {0: "online", 1: "online", 2: "online"})
    fake_root.write("proc/self/status", "VmRSS:\t1 kB\n")
    pages = (306 << 20) // os.sysconf("SC_PAGE_SIZE")
    fake_root.write(
        "proc/zoneinfo",
        f"Node 0, zone      DMA\n  pages free 1\n        present  1000\n"
        f"Node 0, zone    DMA32\n        present  {pages - 1000}\n        managed  9\n",
    )
    assert guest_overhead(fake_root.fs).present == 306 << 20
