"""virtio-mem in a real guest: the host grows and shrinks it by whole blocks, the agent
onlines the blocks by its auto-movable policy, and the memory report shows what the host
could take back. The scenarios run in order on one guest (512 MiB boot memory, a 3 GiB
device), each starting from what the one before left."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.host.display import memory_info_text
from guestagent.host.sizing.boot import VirtioMem, VMConfig
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import (
    boot,
    filler_ready,
    kb_field,
    meminfo_bytes,
    oom_kills,
    start_filler,
    stop_filler,
    wait_until,
)
from tests.workloads.virtio_mem import plug, unplug_after_workload

pytestmark = pytest.mark.vm

BOOT_MIB = 512
DEVICE_MIB = 3072
WORKLOAD_MIB = 400
RESULTS: dict[str, Any] = {}

FILE_DIRS, FILES_PER_DIR = 400, 1000
# Empty files on a tmpfs: each costs an inode and a dentry (about 1 KiB of slab), kernel
# memory that only a kernel zone can hold, and no page of data.
SMALL_FILES = """
import os, sys
root, dirs, per_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for d in range(dirs):
    os.mkdir(f"{root}/{d}")
    for f in range(per_dir):
        os.close(os.open(f"{root}/{d}/{f}", os.O_CREAT | os.O_WRONLY, 0o600))
"""


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    config = VMConfig(memory_mib=BOOT_MIB, virtio_mem=VirtioMem(max_mib=DEVICE_MIB))
    yield from boot(config, image, tmp_path_factory)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "virtio_mem.json").write_text(json.dumps(RESULTS, indent=2) + "\n")


def region(info: pb.MemoryInfo) -> pb.VirtioMemRegion:
    (device,) = info.hotplug.virtio_mem
    return device


def test_plugged_memory_is_onlined_movable(vm: GuestVM, agent: AgentClient) -> None:
    RESULTS["boot_mem_total_bytes"] = meminfo_bytes(vm, "MemTotal")
    figures = plug(vm, BOOT_MIB * MIB, 30)
    RESULTS["plug_512"] = figures
    info = agent.info()
    RESULTS["plug_512"]["info_text"] = memory_info_text(info)
    device = region(info)
    # 512 MiB is well within 301 % of the boot memory: every new block is movable.
    assert (device.movable_blocks, device.normal_blocks, device.offline_blocks) == (4, 0, 0)
    assert device.plugged_bytes == BOOT_MIB * MIB and device.region_bytes == DEVICE_MIB * MIB
    assert info.hotplug.movable_blocks == 4 and info.hotplug.offline_blocks == 0
    zones = vm.exec("cat /sys/devices/system/memory/memory3[2-5]/valid_zones").stdout.split()
    assert zones == ["Movable"] * 4


def test_unplug_after_the_workload_exits_gives_memory_back(vm: GuestVM, agent: AgentClient) -> None:
    kills = oom_kills(vm)
    figures = unplug_after_workload(vm, WORKLOAD_MIB, RESULTS["boot_mem_total_bytes"])
    RESULTS["unplug_after_workload"] = figures
    assert oom_kills(vm) == kills, figures
    info = agent.info()
    assert region(info).plugged_bytes == 0 and info.hotplug.movable_blocks == 0


def kernel_zones_free(vm: GuestVM) -> int:
    """Free bytes in the kernel zones (all but Movable), from /proc/zoneinfo."""
    free, zone = 0, ""
    for line in vm.exec(["cat", "/proc/zoneinfo"]).stdout.splitlines():
        words = line.split()
        if words[:1] == ["Node"]:
            zone = words[-1]
        elif words[:2] == ["pages", "free"] and zone != "Movable":
            free += int(words[2]) * 4096
    return free


def test_beyond_the_ratio_memory_goes_to_a_kernel_zone(vm: GuestVM, agent: AgentClient) -> None:
    """2.5 GiB into a 512 MiB guest: 301 % of 4 boot blocks is 12 movable blocks; the other
    8 go to ZONE_NORMAL, and a kernel-memory-heavy load that needs more kernel memory than
    the boot memory had free runs without an OOM kill."""
    boot_kernel_free = kernel_zones_free(vm)
    kills = oom_kills(vm)
    RESULTS["plug_2560"] = plug(vm, 2560 * MIB, 120)
    device = region(agent.info())
    assert (device.movable_blocks, device.normal_blocks, device.offline_blocks) == (12, 8, 0)
    vm.exec("mkdir -p /mnt/many && mount -t tmpfs -o size=50%,nr_inodes=1000000 tmpfs /mnt/many")
    slab_before = meminfo_bytes(vm, "Slab")
    started = time.monotonic()
    vm.exec(
        ["python3", "-c", SMALL_FILES, "/mnt/many", str(FILE_DIRS), str(FILES_PER_DIR)],
        timeout=1200,
    )
    slab = meminfo_bytes(vm, "Slab")
    RESULTS["small_files"] = {
        "files": FILE_DIRS * FILES_PER_DIR,
        "seconds": round(time.monotonic() - started, 1),
        "slab_before_mib": slab_before // MIB,
        "slab_after_mib": slab // MIB,
        "boot_kernel_zones_free_mib": boot_kernel_free // MIB,
        "info_text": memory_info_text(agent.info()),
    }
    # More kernel memory than the boot memory's kernel zones had free: with every plugged
    # block movable, this could not have been allocated.
    assert slab - slab_before > boot_kernel_free, RESULTS["small_files"]
    assert oom_kills(vm) == kills
    assert agent.health() == "SERVING"


def test_unplug_while_a_workload_holds_the_memory(vm: GuestVM, agent: AgentClient) -> None:
    """The host takes back the movable memory while the files stay and a process holds
    400 MiB of it: the driver migrates the holder's pages into the kernel zones and unplugs
    every movable block; the holder keeps its memory, nothing is OOM-killed, and the
    kernel-zone blocks stay plugged.

    Asking for more than the guest can free does not leave the busy blocks plugged: the
    driver migrates pages until the kernel zones run dry. A 1.2 GiB holder here, and 400 MiB
    in a guest with nothing plugged beyond its 512 MiB of boot memory, were OOM-killed that
    way. So the host must not request less than the guest uses; this asks for the 8
    kernel-zone blocks to stay."""
    kills = oom_kills(vm)
    marker = start_filler(vm, "vmemload", WORKLOAD_MIB, name="holder")
    wait_until(lambda: filler_ready(vm, marker), 600, "the holder's allocation")
    plugged_before = vm.virtio_mem_sizes()[0]
    keep = 8 * 128 * MIB
    started = time.monotonic()
    vm.set_virtio_mem_requested(keep)
    seen_above = region(agent.info()).plugged_bytes
    wait_until(lambda: vm.virtio_mem_sizes()[0] == keep, 600, "the movable blocks to go")
    seconds = time.monotonic() - started

    # The driver removes a block from Linux just after telling QEMU it is unplugged.
    def report_caught_up() -> pb.MemoryInfo | None:
        current = agent.info()
        return current if region(current).plugged_bytes == keep else None

    info = wait_until(report_caught_up, 60, "the report to show the unplug")
    pid = vm.exec(["cat", "/run/holder.pid"]).stdout.strip()
    holder_rss = kb_field(vm.exec(["cat", f"/proc/{pid}/status"]).stdout, "VmRSS")
    # Inodes in use, from statfs: cheaper than walking 400,000 files.
    total, free = vm.exec(["stat", "-f", "-c", "%c %d", "/mnt/many"]).stdout.split()
    RESULTS["unplug_while_held"] = {
        "holder_mib": WORKLOAD_MIB,
        "plugged_before_mib": plugged_before // MIB,
        "requested_mib": keep // MIB,
        "agent_plugged_first_report_mib": seen_above // MIB,
        "unplug_seconds": round(seconds, 1),
        "holder_rss_mib": holder_rss // MIB,
        "inodes_used": int(total) - int(free),
        "oom_kills": oom_kills(vm) - kills,
        "info_text": memory_info_text(info),
    }
    assert oom_kills(vm) == kills, RESULTS["unplug_while_held"]
    # While the driver works, the report shows more plugged than the host asked for.
    assert seen_above > keep, RESULTS["unplug_while_held"]
    assert holder_rss >= WORKLOAD_MIB * MIB, RESULTS["unplug_while_held"]
    assert int(total) - int(free) > FILE_DIRS * FILES_PER_DIR
    device = region(info)
    assert (device.plugged_bytes, device.movable_blocks, device.normal_blocks) == (keep, 0, 8)
    assert agent.health() == "SERVING"
    stop_filler(vm, "holder")
