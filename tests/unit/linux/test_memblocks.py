import pytest

from guestagent.errors import KernelFormat
from guestagent.linux.memblocks import (
    HotplugReportCache,
    MemoryBlock,
    VirtioMemRegion,
    hotplug_report,
    parse_iomem,
    read_hotplug_report,
    virtio_mem_regions,
    zone_of,
)
from guestagent.linux.meminfo import read_report
from guestagent.sizes import MIB
from tests.fakes.root import FakeRoot

BLOCK = 128 * MIB
MEMORY = "sys/devices/system/memory"

# What a 512 MiB guest with a 3 GiB virtio-mem device and 512 MiB plugged showed (abridged).
IOMEM = """\
00000000-00000fff : Reserved
00001000-0009fbff : System RAM
00100000-1ffdffff : System RAM
  0b000000-0bc02d26 : Kernel code
1ffe0000-1fffffff : Reserved
febd0000-febd0fff : PCI Bus 0000:00
  febd0000-febd0fff : 0000:00:02.0
100000000-1bfffffff : virtio4
  100000000-11fffffff : System RAM (virtio_mem)
1c0000000-23fffffff : PCI Bus 0000:00
fd00000000-ffffffffff : Reserved
"""


def test_iomem_nesting_and_sizes() -> None:
    ranges = parse_iomem(IOMEM)
    kernel_code = ranges[3]
    assert (kernel_code.name, kernel_code.depth) == ("Kernel code", 1)
    assert ranges[2].size == 0x1FFE0000 - 0x100000


def test_virtio_mem_region() -> None:
    assert virtio_mem_regions(parse_iomem(IOMEM)) == [
        VirtioMemRegion("virtio4", 0x100000000, 3072 * MIB)
    ]


def test_region_with_nothing_plugged_and_two_devices() -> None:
    text = (
        "100000000-13fffffff : virtio4\n"
        "140000000-17fffffff : virtio5\n"
        "  140000000-147ffffff : System RAM (virtio_mem)\n"
        "  150000000-157ffffff : System RAM (virtio_mem)\n"
    )
    regions = virtio_mem_regions(parse_iomem(text))
    assert [(r.device, r.size) for r in regions] == [("virtio4", 1 << 30), ("virtio5", 1 << 30)]
    assert regions[1].block_range(BLOCK) == range(40, 48)


def test_iomem_without_cap_sys_admin_shows_no_region() -> None:
    # Unprivileged readers see every address as zero: nothing can be told apart.
    text = "00000000-00000000 : virtio4\n  00000000-00000000 : System RAM (virtio_mem)\n"
    assert virtio_mem_regions(parse_iomem(text)) == []


def test_malformed_iomem_is_a_kernel_format_error() -> None:
    with pytest.raises(KernelFormat, match="not 'start-end : name'"):
        parse_iomem("garbage\n")


@pytest.mark.parametrize(
    ("text", "zone"), [("Movable\n", "Movable"), ("Normal\n", "Normal"), ("none\n", "none")]
)
def test_zone_of_online_block(text: str, zone: str) -> None:
    assert zone_of(text) == zone


def test_hotplug_report_counts_zones_overall_and_per_region() -> None:
    region = VirtioMemRegion("virtio4", 32 * BLOCK, 24 * BLOCK)
    blocks = [
        MemoryBlock(0, "online", "none", False),
        MemoryBlock(1, "online", "DMA32", False),
        MemoryBlock(32, "online", "Movable", True),
        MemoryBlock(33, "online", "Normal", True),
        MemoryBlock(34, "offline", None, True),
        MemoryBlock(60, "online", "Movable", True),  # A DIMM, outside the region.
    ]
    report = hotplug_report(BLOCK, blocks, [region])
    assert (report.movable_blocks, report.normal_blocks, report.offline_blocks) == (2, 3, 1)
    (per_region,) = report.regions
    assert (per_region.movable, per_region.normal, per_region.offline) == (1, 1, 1)
    assert per_region.added == 3 * BLOCK


def test_read_report_skips_valid_zones_of_offline_blocks(fake_root: FakeRoot) -> None:
    fake_root.write(f"{MEMORY}/block_size_bytes", "8000000\n")
    fake_root.write("proc/iomem", IOMEM)
    for index, state, zones in [(0, "online", "DMA32"), (32, "online", "Movable")]:
        fake_root.write(f"{MEMORY}/memory{index}/state", f"{state}\n")
        fake_root.write(f"{MEMORY}/memory{index}/valid_zones", f"{zones}\n")
    # A directory instead of a file: reading this valid_zones would raise, as the oops did.
    (fake_root.root / MEMORY / "memory33/valid_zones").mkdir(parents=True)
    fake_root.write(f"{MEMORY}/memory33/state", "offline\n")
    report = read_hotplug_report(fake_root.fs)
    assert report is not None
    assert (report.movable_blocks, report.normal_blocks, report.offline_blocks) == (1, 1, 1)
    # Two of the device's blocks are in sysfs; the iomem entries say 512 MiB, and lag.
    assert report.regions[0].added == 2 * BLOCK


def test_no_memory_hotplug_means_no_report(fake_root: FakeRoot) -> None:
    assert read_hotplug_report(fake_root.fs) is None


def _one_online_one_offline(fake_root: FakeRoot) -> None:
    fake_root.write(f"{MEMORY}/block_size_bytes", "8000000\n")
    fake_root.write(f"{MEMORY}/memory0/state", "online\n")
    fake_root.write(f"{MEMORY}/memory0/valid_zones", "Normal\n")
    fake_root.write(f"{MEMORY}/memory1/state", "offline\n")


def _online_block_1(fake_root: FakeRoot) -> None:
    fake_root.write(f"{MEMORY}/memory1/state", "online\n")
    fake_root.write(f"{MEMORY}/memory1/valid_zones", "Movable\n")


def _offline_blocks(cache: HotplugReportCache, fake_root: FakeRoot, mem_total: int) -> int:
    report = cache.report(fake_root.fs, mem_total)
    assert report is not None
    return report.offline_blocks


def test_the_hotplug_section_is_read_again_when_memtotal_or_the_blocks_change(
    fake_root: FakeRoot,
) -> None:
    _one_online_one_offline(fake_root)
    cache = HotplugReportCache()
    assert _offline_blocks(cache, fake_root, 1 << 30) == 1
    _online_block_1(fake_root)
    assert _offline_blocks(cache, fake_root, 1 << 30) == 1  # Nothing it keys on changed.
    assert _offline_blocks(cache, fake_root, (1 << 30) + (128 << 20)) == 0  # MemTotal grew.
    fake_root.write(f"{MEMORY}/memory2/state", "offline\n")
    assert _offline_blocks(cache, fake_root, (1 << 30) + (128 << 20)) == 1  # A block was added.


def test_each_cache_keeps_its_own_reading(fake_root: FakeRoot) -> None:
    _one_online_one_offline(fake_root)
    first = HotplugReportCache()
    assert _offline_blocks(first, fake_root, 1 << 30) == 1
    _online_block_1(fake_root)
    assert _offline_blocks(first, fake_root, 1 << 30) == 1
    # Another daemon's (or test's) cache has not read before: it sees the block online.
    assert _offline_blocks(HotplugReportCache(), fake_root, 1 << 30) == 0


def test_the_report_reads_hotplug_through_the_cache_it_is_given(fake_root: FakeRoot) -> None:
    _one_online_one_offline(fake_root)
    cache = HotplugReportCache()

    def offline(hotplug: HotplugReportCache | None) -> int:
        report = read_report(fake_root.fs, hotplug=hotplug).hotplug
        assert report is not None
        return report.offline_blocks

    assert offline(cache) == 1
    _online_block_1(fake_root)  # MemTotal in the fake /proc/meminfo stays as it was.
    assert offline(cache) == 1
    assert offline(None) == 0  # No cache: read afresh every time.
