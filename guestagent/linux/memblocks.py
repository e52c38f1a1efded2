"""Memory blocks (/sys/devices/system/memory) and the virtio-mem regions they belong to.

The kernel hot-adds and onlines memory in blocks of block_size_bytes. Which zone an online
block sits in decides whether it can be unplugged again: ZONE_MOVABLE holds only pages the
kernel can migrate away, the kernel zones (DMA, DMA32, Normal) also hold its own unmovable
allocations. virtio-mem devices show up in /proc/iomem as a top-level "virtioN" region;
sysfs has no plugged or requested size for them (Linux 6.1), so the memory blocks the
driver has added in that region are the guest's view of "plugged". (Its "System RAM
(virtio_mem)" entries in /proc/iomem were seen to trail a block's removal.)

Parsing is pure; the reads are at the bottom.
"""

from __future__ import annotations

import os
import re

from guestagent.errors import AgentError, KernelFormat
from guestagent.linux.fs import KernelFS
from guestagent.records import record

MOVABLE_ZONE = "Movable"
_IOMEM_LINE = re.compile(r"^(?P<indent> *)(?P<start>[0-9a-f]+)-(?P<end>[0-9a-f]+) : (?P<name>.*)$")
_VIRTIO_DEVICE = re.compile(r"^virtio\d+$")


@record
class IomemRange:
    start: int
    end: int  # Inclusive, as /proc/iomem prints it.
    name: str
    depth: int

    @property
    def size(self) -> int:
        return self.end - self.start + 1


@record
class VirtioMemRegion:
    device: str  # The virtio device, e.g. "virtio4".
    start: int
    size: int  # The device's whole region: the most it can ever plug.

    def block_range(self, block_size: int) -> range:
        return range(self.start // block_size, (self.start + self.size) // block_size)


@record
class MemoryBlock:
    index: int
    state: str  # online, offline, going-offline
    # The zone of an online block ("Movable", "Normal", "DMA32", "none" when it spans two);
    # None for offline blocks, whose valid_zones is never read (see read_memory_blocks).
    zone: str | None
    # Hot-plugged: in a virtio-mem region or an ACPI memory device (a DIMM), not boot RAM.
    hotplugged: bool

    @property
    def online(self) -> bool:
        return self.state == "online"

    @property
    def movable(self) -> bool:
        return self.online and self.zone == MOVABLE_ZONE


@record
class RegionBlocks:
    region: VirtioMemRegion
    movable: int
    normal: int
    offline: int
    added: int  # Bytes in the memory blocks the driver has added to Linux.


@record
class HotplugReport:
    block_size: int
    movable_blocks: int  # Online in ZONE_MOVABLE.
    normal_blocks: int  # Online in a kernel zone.
    offline_blocks: int
    regions: tuple[RegionBlocks, ...]


def parse_iomem(text: str) -> list[IomemRange]:
    ranges = []
    for line in text.splitlines():
        match = _IOMEM_LINE.match(line)
        if match is None:
            if line.strip():
                raise KernelFormat(f"/proc/iomem line {line!r} is not 'start-end : name'")
            continue
        ranges.append(
            IomemRange(
                int(match["start"], 16),
                int(match["end"], 16),
                match["name"],
                len(match["indent"]) // 2,
            )
        )
    return ranges


def virtio_mem_regions(ranges: list[IomemRange]) -> list[VirtioMemRegion]:
    """Top-level "virtioN" ranges: only virtio-mem claims RAM that way. Without
    CAP_SYS_ADMIN the kernel prints every address as 0: then there is nothing to tell
    apart, and no region is reported."""
    return [
        VirtioMemRegion(entry.name, entry.start, entry.size)
        for entry in ranges
        if entry.depth == 0 and _VIRTIO_DEVICE.match(entry.name) and entry.end > 0
    ]


def zone_of(valid_zones: str) -> str:
    """An online block's valid_zones names the one zone it is in."""
    words = valid_zones.split()
    if not words:
        raise KernelFormat("valid_zones of an online memory block is empty")
    return words[0]


def hotplug_report(
    block_size: int, blocks: list[MemoryBlock], regions: list[VirtioMemRegion]
) -> HotplugReport:
    def counts(selected: list[MemoryBlock]) -> tuple[int, int, int]:
        movable = sum(1 for b in selected if b.movable)
        normal = sum(1 for b in selected if b.online and not b.movable)
        return movable, normal, len(selected) - movable - normal

    total = counts(blocks)
    per_region = []
    for region in regions:
        indices = region.block_range(block_size)
        movable, normal, offline = counts([b for b in blocks if b.index in indices])
        added = (movable + normal + offline) * block_size
        per_region.append(RegionBlocks(region, movable, normal, offline, added))
    return HotplugReport(block_size, *total, tuple(per_region))


def memory_root(fs: KernelFS) -> str:
    return fs.sys("devices", "system", "memory")


def set_block_state(fs: KernelFS, name: str, state: str) -> None:
    fs.write(os.path.join(memory_root(fs), name, "state"), state)


def block_state(fs: KernelFS, name: str) -> str | None:
    """A memory block's state ("online", "offline", ...), None when it is gone."""
    text = fs.read_optional(os.path.join(memory_root(fs), name, "state"))
    return text.strip() if text is not None else None


def block_size_bytes(fs: KernelFS) -> int:
    # The kernel prints it in hex without a 0x prefix.
    return fs.read_parsed(
        os.path.join(memory_root(fs), "block_size_bytes"), lambda text: int(text, 16)
    )


def memory_blocks(fs: KernelFS) -> dict[str, str]:
    """Each memoryN block's state (online, offline, ...), by name."""
    root = memory_root(fs)
    if not fs.is_dir(root):
        return {}
    blocks = {}
    for name in fs.listdir(root):
        if name.startswith("memory") and name[6:].isdigit():
            state = fs.read_optional(os.path.join(root, name, "state"))
            if state is not None:
                blocks[name] = state.strip()
    return blocks


def read_virtio_mem_regions(fs: KernelFS) -> list[VirtioMemRegion]:
    iomem = fs.read_optional(fs.proc("iomem"))
    return virtio_mem_regions(parse_iomem(iomem)) if iomem is not None else []


def read_memory_blocks(fs: KernelFS, regions: list[VirtioMemRegion]) -> list[MemoryBlock]:
    """Every block, ascending. valid_zones is read for online blocks only: on Linux 6.1,
    reading it for a virtio-mem block that was just added (still offline) oopsed."""
    root = memory_root(fs)
    states = memory_blocks(fs)
    if not states:
        return []
    block_size = block_size_bytes(fs)
    in_regions = {i for region in regions for i in region.block_range(block_size)}
    blocks = []
    for name, state in sorted(states.items(), key=lambda item: int(item[0][6:])):
        index = int(name[6:])
        zone = None
        if state == "online":
            text = fs.read_optional(os.path.join(root, name, "valid_zones"))
            zone = zone_of(text) if text is not None else None
        # ACPI binds a hot-plugged DIMM's blocks to its memory device.
        hotplugged = index in in_regions or fs.exists(os.path.join(root, name, "firmware_node"))
        blocks.append(MemoryBlock(index, state, zone, hotplugged))
    return blocks


def read_hotplug_report(fs: KernelFS) -> HotplugReport | None:
    """None when the kernel has no memory hotplug (no block_size_bytes)."""
    if fs.read_optional(os.path.join(memory_root(fs), "block_size_bytes")) is None:
        return None
    regions = read_virtio_mem_regions(fs)
    return hotplug_report(block_size_bytes(fs), read_memory_blocks(fs, regions), regions)


class HotplugReportCache:
    """The last hotplug section read, and what it was read for.

    The section costs an open per block file (7.4 ms a report for 196 blocks on a 24 GiB
    machine), so it is read again only when MemTotal or the number of blocks has changed:
    onlining, offlining, plugging and unplugging each change one of them.
    """

    def __init__(self) -> None:
        self._last: tuple[tuple[str, int, int], HotplugReport | None] | None = None

    def report(self, fs: KernelFS, mem_total: int) -> HotplugReport | None:
        root = memory_root(fs)
        try:
            blocks = len(fs.listdir(root))
        except AgentError:
            blocks = -1
        key = (root, mem_total, blocks)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        report = read_hotplug_report(fs)
        self._last = (key, report)
        return report
