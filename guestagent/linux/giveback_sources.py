"""The kernel values the give-back figures (ops/giveback_figures.py) come from: /proc/meminfo's LRU
and slab lines, free blocks per order, the zones' high watermarks, the order free page
reporting takes, the cgroups' protections and the virtio-mem devices' blocks."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

from guestagent.errors import AgentError
from guestagent.linux.abi import PAGE_SIZE, reporting_order
from guestagent.linux.cgroup.memory import MemoryCgroup
from guestagent.linux.fs import KernelFS
from guestagent.linux.memblocks import HotplugReport
from guestagent.linux.meminfo import SystemMemory
from guestagent.linux.mm import read_free_blocks_optional, zoneinfo_sum
from guestagent.records import record


@record
class DeviceBlocks:
    """A virtio-mem device as the guest holds it."""

    device: str
    plugged: int
    movable: int  # Bytes of its blocks online in ZONE_MOVABLE.
    block_size: int


@record
class Protection:
    """A top-level cgroup's memory.min/memory.low as far as it uses it."""

    path: str
    current: int
    protected: int


@record
class GiveBackSources:
    """The system-wide kernel values the figures come from, in bytes."""

    mem_total: int
    mem_free: int
    lru_anon: int  # Active + Inactive anon (with shmem).
    lru_file: int  # Active + Inactive file.
    reclaimable_slab: int  # SReclaimable.
    swap_room: int | None  # Free space in the active swap areas; None: there is none.
    watermarks: int  # The zones' high watermarks, summed (kswapd keeps free memory above).
    free_blocks: tuple[int, ...]  # Free blocks per order.
    reporting_order: int
    page_size: int = PAGE_SIZE
    devices: tuple[DeviceBlocks, ...] = ()
    protections: tuple[Protection, ...] = ()  # The protected top-level cgroups.

    @property
    def lru(self) -> int:
        return self.lru_anon + self.lru_file

    @property
    def protected(self) -> int:
        """The cgroups' memory.min/memory.low, as far as they use it."""
        return sum(p.protected for p in self.protections)


def protected_of(current: int, protection: int | None) -> int:
    """What a cgroup's protection (MemoryCgroup.protection; None is "max") covers of
    what it uses."""
    return current if protection is None else min(current, protection)


def read_protected(fs: KernelFS) -> tuple[Protection, ...]:
    """The protected cgroups under the root: a deeper cgroup's protection is bounded by its
    ancestors' (cgroup-v2.rst: memory.low), so the top level holds it all."""
    root = fs.cgroup_root
    found = []
    for name in fs.subdirectories(root) if fs.is_dir(root) else []:
        cgroup = MemoryCgroup(fs, os.path.join(root, name), name)
        try:
            protection = cgroup.protection()
            if protection == 0:
                continue  # Unprotected (most are): spare reading memory.current.
            used = cgroup.current_or_zero()
        except AgentError:
            continue  # Gone meanwhile.
        if protected := protected_of(used, protection):
            found.append(Protection(name, used, protected))
    return tuple(found)


def read_swap_barred(fs: KernelFS, paths: Iterable[str]) -> frozenset[str]:
    """The memcg paths (as lru_gen prints them: "/pod/ctr") that may not swap: memory.swap.max
    is 0 on the cgroup or an ancestor (kubelet's NoSwap, systemd's MemorySwapMax=0)."""
    barred: dict[str, bool] = {"/": False, "": False}

    def is_barred(path: str) -> bool:
        if path not in barred:
            parent = path.rsplit("/", 1)[0] or "/"
            cgroup = MemoryCgroup(fs, os.path.join(fs.cgroup_root, path.lstrip("/")), path)
            here = False
            with contextlib.suppress(AgentError):  # Gone meanwhile: nothing to bar.
                here = cgroup.swap_barred()
            barred[path] = is_barred(parent) or here
        return barred[path]

    return frozenset(path for path in paths if is_barred(path.rstrip("/") or "/"))


def read_reporting_order(fs: KernelFS, orders: int, page_size: int) -> int:
    """The order free page reporting takes: its module parameter when set to an order the
    buddy allocator has, else what virtio-balloon asks for (abi.reporting_order)."""
    text = fs.read_optional(
        fs.sys("module", "page_reporting", "parameters", "page_reporting_order")
    )
    try:
        order = int(text) if text is not None else -1
    except ValueError:
        order = -1
    return order if 0 <= order < orders else reporting_order(page_size)


def devices_of(hotplug: HotplugReport | None) -> tuple[DeviceBlocks, ...]:
    if hotplug is None:
        return ()
    size = hotplug.block_size
    return tuple(
        DeviceBlocks(r.region.device, r.added, r.movable * size, size) for r in hotplug.regions
    )


def read_giveback_sources(
    fs: KernelFS,
    system: SystemMemory,
    hotplug: HotplugReport | None,
    page_size: int = PAGE_SIZE,
) -> GiveBackSources:
    """system: the report's own /proc/meminfo reading, so both describe the same moment."""
    free_blocks = read_free_blocks_optional(fs) or ()
    zoneinfo = fs.read_optional(fs.proc("zoneinfo"))
    return GiveBackSources(
        mem_total=system.mem_total,
        mem_free=system.mem_free,
        lru_anon=system.lru_anon,
        lru_file=system.lru_file,
        reclaimable_slab=system.reclaimable_slab,
        swap_room=system.swap_free if system.swap_total else None,
        watermarks=zoneinfo_sum(zoneinfo, "high") * page_size if zoneinfo else 0,
        free_blocks=free_blocks,
        reporting_order=read_reporting_order(fs, len(free_blocks), page_size),
        page_size=page_size,
        devices=devices_of(hotplug),
        protections=read_protected(fs),
    )
