"""The arm64 smoke suite: the agent from `make bundle ARCH=arm64` in an aarch64 guest under
qemu-system-aarch64 (TCG, -M virt), and the same tests in the x86_64 guest beside it, so each
figure has its x86_64 counterpart from the same run (tests/vm/results/arm64-smoke.json).

One guest per architecture, the tests in order: boot, GetMemoryInfo, EnableSwap on a blank
disk, SetMemoryLimits with a swap total (L=64M, S=256M) and the swap given back to the host
once the workload ends, Compact, the reclaimer on a cold cgroup, and the refusal of a disk
holding ext4.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import (
    MACHINES,
    Disk,
    VirtioMem,
    VMConfig,
    image_dir_for,
    installed_qemu_version,
)
from guestagent.linux.abi import huge_order
from guestagent.sizes import MIB
from guestagent.transport.address import DEFAULT_VSOCK_PORT
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import DEFAULT_IMAGE_DIR, GuestVM
from tests.vm import pace
from tests.vm.conftest import image_or_skip
from tests.vm.guest import (
    boot,
    enable,
    expect_ext4_refused,
    filler_ready,
    guestctl,
    node_of,
    read_guest,
    rotational,
    start_filler,
    stop_filler,
    swap_and_release,
    wait_until,
    wait_until_steady,
)
from tests.vm.pace import Deadline

pytestmark = pytest.mark.vm

ARCHES = ("aarch64", "x86_64")
DISKS = (Disk("swap", 1 << 30, serial="swap0"), Disk("ext", 64 * MIB, serial="ext0"))
# The table's row L=64M, S=256M (tests/vm/test_limits.py): a workload of 150 MiB swaps.
LIMIT, SWAP, WORKLOAD_MIB = 64 * MIB, 256 * MIB, 150
COLD_MIB = 160
RESULTS: dict[str, dict[str, Any]] = {}


def has_virtio_mem(arch: str) -> bool:
    return installed_qemu_version(arch) >= MACHINES[arch].virtio_mem_since


def config(arch: str) -> VMConfig:
    # x86_64's virtio-mem is tests/vm/test_virtio_mem.py's; aarch64's is tried here.
    virtio_mem = VirtioMem(max_mib=512) if arch == "aarch64" and has_virtio_mem(arch) else None
    # CID 1 allowed: the vsock test calls from inside the guest, over vsock loopback.
    return VMConfig(
        arch=arch,
        memory_mib=768,
        disks=DISKS,
        virtio_mem=virtio_mem,
        agent_args=("--allow-cid", "1"),
    )


@pytest.fixture(scope="module", params=ARCHES)
def vm(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GuestVM]:
    arch: str = request.param
    image = image_or_skip(image_dir_for(arch, DEFAULT_IMAGE_DIR))
    figures = RESULTS.setdefault(arch, {})
    for guest in boot(config(arch), image, tmp_path_factory):
        figures["boot_to_serving_seconds"] = round(guest.boot_seconds or 0, 1)
        figures["pace"] = pace.of(guest).factor
        figures["probe_seconds"] = pace.of(guest).probe_seconds
        yield guest
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "arm64-smoke.json").write_text(json.dumps(RESULTS, indent=2) + "\n")


def figures_of(vm: GuestVM) -> dict[str, Any]:
    return RESULTS[vm.config.arch]


def test_the_guest_is_the_architecture_asked_for(vm: GuestVM, agent: AgentClient) -> None:
    assert vm.exec(["uname", "-m"]).stdout.strip() == vm.config.arch
    page_size = int(vm.exec(["getconf", "PAGESIZE"]).stdout)
    figures_of(vm)["page_size"] = page_size
    # The bundle's interpreter is the guest's machine's: its ELF e_machine (x86_64 62,
    # aarch64 183) read in the guest.
    machine = vm.exec("od -An -tu2 -j18 -N2 /opt/guestagent/bin/python3.11").stdout.split()
    assert {"x86_64": ["62"], "aarch64": ["183"]}[vm.config.arch] == machine
    assert agent.health() == "SERVING"


def test_the_agent_answers_over_vsock_loopback(vm: GuestVM) -> None:
    result = guestctl(
        vm, f"vsock://1:{DEFAULT_VSOCK_PORT}", "health", deadline=Deadline(pace.of(vm).scale(60))
    )
    assert result.rc == 0 and "SERVING" in result.stdout, result


def test_get_memory_info(vm: GuestVM, agent: AgentClient) -> None:
    system = agent.info().system
    assert 600 * MIB < system.mem_total_bytes <= 768 * MIB
    assert 0 < system.mem_available_bytes < system.mem_total_bytes
    assert system.swap_total_bytes == 0
    figures_of(vm)["mem_total_mib"] = system.mem_total_bytes // MIB


def test_enable_swap_on_a_blank_disk(vm: GuestVM, agent: AgentClient) -> None:
    assert rotational(vm, "swap0") == "1"
    area = enable(agent, device=pb.DeviceSelector(serial="swap0"))
    assert area.device == node_of(vm, "swap0")
    assert area.formatted and area.discard == pb.DISCARD_BOTH and area.discard_supported
    assert not area.rotational and rotational(vm, "swap0") == "0"
    assert area.device in read_guest(vm, "/proc/swaps")


def test_limits_with_a_swap_total_swap_instead_of_oom(vm: GuestVM, agent: AgentClient) -> None:
    applied = agent.set_limits("pod/ctr", pb.LinuxMemory(limit=LIMIT, swap=SWAP), create=True)
    assert (applied.memory_max, applied.swap_max) == (str(LIMIT), str(SWAP - LIMIT))
    figures = swap_and_release(vm, "pod/ctr", WORKLOAD_MIB, "swap")
    events = read_guest(vm, "/sys/fs/cgroup/pod/ctr/memory.events")
    oom_kills = int(dict(line.split() for line in events.splitlines())["oom_kill"])
    figures_of(vm)["limits_64m_256m"] = {**figures, "oom_kills": oom_kills}
    assert oom_kills == 0, figures
    assert figures["swapped_mib"] > (WORKLOAD_MIB - 64) * 0.8, figures
    # The sparse file behind the disk gives its blocks back once the workload's swap is freed.
    assert figures["released_fraction"] > 0.8, figures


def test_compact(vm: GuestVM, agent: AgentClient) -> None:
    result = agent.compact()
    page_size = figures_of(vm)["page_size"]
    # A PMD's worth of pages: 2 MiB with the 4 KiB pages both kernels here run.
    assert result.huge_block_bytes == page_size << huge_order(page_size)
    assert result.free_huge_bytes_after > 0 and len(result.free_blocks_after) >= 11
    figures_of(vm)["compact"] = {
        "duration_ms": round(result.duration_us / 1000, 1),
        "free_huge_mib_before": result.free_huge_bytes_before // MIB,
        "free_huge_mib_after": result.free_huge_bytes_after // MIB,
    }


def test_the_reclaimer_gives_a_cold_cgroup_back_to_the_host(
    vm: GuestVM, agent: AgentClient
) -> None:
    speed = pace.of(vm)
    agent.set_limits("cold", pb.LinuxMemory(limit=-1), create=True)
    marker = start_filler(vm, "cold", COLD_MIB, name="cold")
    wait_until(lambda: filler_ready(vm, marker), speed.scale(300), "the cold workload")
    window = speed.scale(2.5)
    # RSS without TCG's translated code, which grows whatever the guest holds.
    before = wait_until_steady(
        vm.qemu_guest_rss_bytes, speed.scale(120), "QEMU's RSS", tolerance=4 * MIB, window=window
    )
    agent.set_reclaim_policy("cold", True, pb.ReclaimPolicy(anon=True))
    after = wait_until_steady(
        vm.qemu_guest_rss_bytes,
        speed.scale(180),
        "QEMU's RSS to fall by half the cold workload and hold still",
        tolerance=4 * MIB,
        window=window,
        done=lambda rss: before - rss >= COLD_MIB * MIB // 2,
    )
    status = agent.reclaim_status(["cold"]).targets[0]
    agent.set_reclaim_policy("cold", False)
    stop_filler(vm, "cold")
    figures_of(vm)["reclaimer"] = {
        "cold_mib": COLD_MIB,
        "qemu_rss_before_mib": before // MIB,
        "qemu_rss_after_mib": after // MIB,
        "cgroup_current_after_mib": round(status.current_bytes / MIB, 1),
        "reclaimed_by_the_policy_mib": status.reclaimed_total_bytes // MIB,
    }
    # What the guest still holds of the workload is the kernel's figure; the policy's own
    # account of its steps is recorded beside it.
    assert status.reclaimed_total_bytes > 0 and status.current_bytes < COLD_MIB * MIB // 2


def test_a_disk_holding_ext4_is_refused_and_keeps_its_data(vm: GuestVM, agent: AgentClient) -> None:
    device = node_of(vm, "ext0")
    vm.exec(f"mkfs.ext4 -q -F {device} && mkdir -p /mnt/ext && mount {device} /mnt/ext")
    vm.exec("head -c 4M /dev/urandom > /mnt/ext/data && sync && umount /mnt/ext")
    checksum = vm.exec(f"sha256sum {device}").stdout.split()[0]
    expect_ext4_refused(agent, "ext0", device)
    assert vm.exec(f"sha256sum {device}").stdout.split()[0] == checksum
    assert rotational(vm, "ext0") == "1"


def test_virtio_mem(vm: GuestVM, agent: AgentClient) -> None:
    arch = vm.config.arch
    if arch == "x86_64":
        pytest.skip("x86_64's virtio-mem is tests/vm/test_virtio_mem.py")
    if vm.config.virtio_mem is None:
        since = MACHINES[arch].virtio_mem_since
        pytest.skip(
            f"{MACHINES[arch].qemu} {'.'.join(map(str, installed_qemu_version(arch)))} has no "
            f"virtio-mem-pci on -M virt (QEMU {since[0]}.{since[1]} added it; Debian 12 has 7.2)"
        )
    before = agent.info().system.mem_total_bytes
    vm.set_virtio_mem_requested(256 * MIB)
    wait_until(
        lambda: agent.info().system.mem_total_bytes >= before + 200 * MIB,
        pace.of(vm).scale(120),
        "MemTotal to grow by the plugged virtio-mem blocks",
    )
