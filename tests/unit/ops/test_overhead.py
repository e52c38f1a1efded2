import os

from guestagent.linux.cgroup.name import cgroup_name
from guestagent.linux.features import Absent
from guestagent.linux.memblocks import block_size_bytes
from guestagent.linux.swiotlb import DEBUGFS_SOURCE, Swiotlb
from guestagent.ops.overhead import guest_overhead
from tests.fakes.root import FakeRoot


def test_overhead_figures(fake_root: FakeRoot) -> None:
    fake_root.add_memory_blocks({0: "online", 1: "online", 2: "online", 3: "online", 4: "offline"})
    fake_root.add_cgroup("pod", current=50 << 20)
    fake_root.write("proc/self/status", "Name:\tpython3\nVmRSS:\t   40960 kB\n")
    overhead = guest_overhead(fake_root.fs, (cgroup_name("pod"),))
    assert block_size_bytes(fake_root.fs) == 128 << 20
    assert overhead.present == 4 * (128 << 20)
    assert overhead.mem_total == 498764 * 1024
    assert overhead.kernel_reserved == overhead.present - overhead.mem_total
    used = (498764 - 398100) * 1024
    assert overhead.outside_workloads == used - (50 << 20)
    assert overhead.agent_rss == 40960 * 1024 and overhead.workloads == 50 << 20


def test_present_comes_from_zoneinfo_not_rounded_blocks(fake_root: FakeRoot) -> None:
    # A 306 MiB guest has three 128 MiB blocks online, but only 306 MiB of RAM present.
    fake_root.add_memory_blocks({0: "online", 1: "online", 2: "online"})
    fake_root.write("proc/self/status", "VmRSS:\t1 kB\n")
    pages = (306 << 20) // os.sysconf("SC_PAGE_SIZE")
    fake_root.write(
        "proc/zoneinfo",
        f"Node 0, zone      DMA\n  pages free 1\n        present  1000\n"
        f"Node 0, zone    DMA32\n        present  {pages - 1000}\n        managed  9\n",
    )
    assert guest_overhead(fake_root.fs).present == 306 << 20


def test_overhead_names_the_swiotlb_within_the_kernel_reserve(fake_root: FakeRoot) -> None:
    fake_root.add_memory_blocks({0: "online"})
    fake_root.write("proc/self/status", "VmRSS:\t1 kB\n")
    assert isinstance(guest_overhead(fake_root.fs).swiotlb, Absent)
    fake_root.write("sys/kernel/debug/swiotlb/io_tlb_nslabs", "32768\n")
    assert guest_overhead(fake_root.fs).swiotlb == Swiotlb(64 << 20, DEBUGFS_SOURCE)
