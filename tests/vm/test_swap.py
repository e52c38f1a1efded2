"""Swap in a real guest: a sparse swap file on the host, udev, mkswap, swapon, discard."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm import pace
from tests.vm.guest import (
    boot,
    enable,
    expect_error,
    expect_ext4_refused,
    fill_and_release,
    kill_agent,
    node_of,
    read_guest,
    rotational,
    wait_until,
)

pytestmark = pytest.mark.vm

DISKS = (
    Disk("swap", 1 << 30, serial="swap0"),
    Disk("swapnd", 1 << 30, serial="swap1"),
    Disk("ext", 64 * MIB, serial="ext0"),
    Disk("tiny", 32 * 1024, serial="tiny0"),
    Disk("text", 64 * MIB, serial="text0"),
    Disk("mid", 64 * MIB, serial="mid0"),
    Disk("big", 8 << 30, serial="big0"),
)
RESULTS: dict[str, object] = {}


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    config = VMConfig(memory_mib=512, disks=DISKS)
    yield from boot(config, image, tmp_path_factory)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "swap.json").write_text(json.dumps(RESULTS, indent=2) + "\n")


def uevent_listeners(vm: GuestVM) -> int:
    """Netlink sockets bound to uevent groups (protocol 15, NETLINK_KOBJECT_UEVENT)."""
    rows = (line.split() for line in read_guest(vm, "/proc/net/netlink").splitlines()[1:])
    return sum(row[1] == "15" and int(row[3], 16) != 0 for row in rows)


def test_virtio_disk_starts_rotational(vm: GuestVM) -> None:
    assert rotational(vm, "swap0") == "1"


def test_enable_by_serial(vm: GuestVM, agent: AgentClient) -> None:
    started = time.monotonic()
    area = enable(agent, device=pb.DeviceSelector(serial="swap0"), priority=10)
    RESULTS["enable_1gib_seconds"] = round(time.monotonic() - started, 3)
    device = node_of(vm, "swap0")
    assert area.device == device
    assert area.formatted and not area.already_active
    assert area.priority == 10 and area.discard == pb.DISCARD_BOTH
    assert area.discard_supported
    assert not area.rotational and rotational(vm, "swap0") == "0"
    swaps = read_guest(vm, "/proc/swaps")
    line = next(line for line in swaps.splitlines() if line.startswith(device))
    assert line.split()[4] == "10"
    blkid = vm.exec(["blkid", "-o", "export", device]).stdout
    assert "TYPE=swap" in blkid and f"UUID={area.uuid}" in blkid


def test_second_enable_changes_nothing(vm: GuestVM, agent: AgentClient) -> None:
    before = read_guest(vm, "/proc/swaps")
    area = enable(agent, device=pb.DeviceSelector(serial="swap0"), priority=99)
    assert area.already_active and not area.formatted
    assert area.priority == 10
    assert read_guest(vm, "/proc/swaps") == before


def test_restarted_agent_rediscovers_the_area(vm: GuestVM, agent: AgentClient) -> None:
    kill_agent(vm)  # init respawns it
    agent.wait_ready(pace.of(vm).scale(90))
    areas = {a.device: a for a in agent.list_swaps()}
    area = areas[node_of(vm, "swap0")]
    assert area.priority == 10 and area.discard == pb.DISCARD_BOTH and not area.rotational


def test_swap_blocks_go_back_to_the_host(vm: GuestVM, agent: AgentClient) -> None:
    figures = fill_and_release(vm, "swap")
    RESULTS["discard_both"] = figures
    assert figures["swapped_mib"] > 150, figures  # The process really lived in swap.
    assert figures["allocated_peak_mib"] > 150, figures
    assert figures["released_fraction"] > 0.8, figures


def test_without_discard_the_host_keeps_the_blocks(vm: GuestVM, agent: AgentClient) -> None:
    agent.disable_swap(pb.DeviceSelector(serial="swap0"))
    area = enable(agent, device=pb.DeviceSelector(serial="swap1"), discard=pb.DISCARD_NONE)
    assert area.discard == pb.DISCARD_NONE
    figures = fill_and_release(vm, "swapnd")
    RESULTS["discard_none"] = figures
    assert figures["allocated_peak_mib"] > 150, figures
    assert figures["released_fraction"] < 0.2, figures
    agent.disable_swap(pb.DeviceSelector(serial="swap1"))


def test_a_disk_with_a_filesystem_is_refused_and_keeps_its_data(
    vm: GuestVM, agent: AgentClient
) -> None:
    device = node_of(vm, "ext0")
    vm.exec(f"mkfs.ext4 -q -F {device} && mkdir -p /mnt/ext && mount {device} /mnt/ext")
    vm.exec("head -c 4M /dev/urandom > /mnt/ext/data && sync")
    checksum = vm.exec("sha256sum /mnt/ext/data").stdout.split()[0]
    expect_error(
        lambda: enable(agent, device=pb.DeviceSelector(serial="ext0")),
        grpc.StatusCode.FAILED_PRECONDITION,
        device,
        "mounted on /mnt/ext",
    )
    vm.exec("umount /mnt/ext")
    expect_ext4_refused(agent, "ext0", device)
    vm.exec(f"mount {device} /mnt/ext")
    assert vm.exec("sha256sum /mnt/ext/data").stdout.split()[0] == checksum
    vm.exec("umount /mnt/ext")


def test_a_regular_file_is_refused(vm: GuestVM, agent: AgentClient) -> None:
    vm.exec("truncate -s 64M /dev/notablock")
    expect_error(
        lambda: enable(agent, device=pb.DeviceSelector(path="/dev/notablock")),
        grpc.StatusCode.FAILED_PRECONDITION,
        "/dev/notablock is not a block device",
    )
    expect_error(
        lambda: enable(agent, device=pb.DeviceSelector(path="/root/swapfile")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "not under /dev",
    )


def test_a_missing_serial_times_out(agent: AgentClient) -> None:
    expect_error(
        lambda: enable(agent, device=pb.DeviceSelector(serial="nope9"), wait_ms=700),
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "serial 'nope9'",
        "700 ms",
    )


def test_a_failed_mkswap_leaves_the_disk_as_found(vm: GuestVM, agent: AgentClient) -> None:
    device = node_of(vm, "tiny0")
    vm.exec(f"printf 'keep me' | dd of={device} bs=512 seek=2 conv=notrunc status=none && sync")
    checksum = vm.exec(f"sha256sum {device}").stdout.split()[0]
    # force: without it the text is unknown data and nothing would reach mkswap.
    details = expect_error(
        lambda: enable(agent, device=pb.DeviceSelector(serial="tiny0"), force=True),
        grpc.StatusCode.ABORTED,
        device,
        "mkswap exited",
    )
    assert vm.exec(f"sha256sum {device}").stdout.split()[0] == checksum, details
    assert rotational(vm, "tiny0") == "1", details


def test_a_hot_plugged_disk_is_waited_for(vm: GuestVM, agent: AgentClient, tmp_path: Path) -> None:
    backing = tmp_path / "hot.raw"
    with open(backing, "wb") as f:
        f.truncate(256 * MIB)
    result: dict[str, object] = {}

    def call() -> None:
        try:
            result["area"] = enable(agent, device=pb.DeviceSelector(serial="hot0"), wait_ms=60_000)
        except grpc.RpcError as e:
            result["error"] = e

    listening = uevent_listeners(vm)
    caller = threading.Thread(target=call)
    caller.start()
    # Plug the disk only once the agent listens for its udev event, so the wait is tested.
    wait_until(
        lambda: uevent_listeners(vm) > listening or "error" in result,
        pace.of(vm).scale(60),
        "the agent to listen for udev events",
    )
    vm.qmp(
        "blockdev-add",
        **{
            "driver": "raw",
            "node-name": "hot0",
            "discard": "unmap",
            "file": {"driver": "file", "filename": str(backing)},
        },
    )
    vm.qmp("device_add", driver="virtio-blk-pci", drive="hot0", serial="hot0", id="hotdisk")
    caller.join(timeout=pace.of(vm).scale(120))
    assert "error" not in result, result
    area = result["area"]
    assert isinstance(area, pb.SwapArea)
    assert area.formatted and area.size_bytes > 200 * MIB and not area.rotational
    agent.disable_swap(pb.DeviceSelector(serial="hot0"))


def write_guest_disk(vm: GuestVM, serial: str, command: str, seek_mib: int) -> str:
    """Write what `command` prints to a disk at seek_mib, synced, with udev done looking."""
    device = node_of(vm, serial)
    vm.exec(
        f"{command} | dd of={device} bs=1M seek={seek_mib} iflag=fullblock conv=notrunc,fsync "
        "status=none && udevadm settle"
    )
    return device


def test_unknown_data_is_refused_naming_the_offset(vm: GuestVM, agent: AgentClient) -> None:
    device = write_guest_disk(vm, "text0", "printf 'sixteen bytes!!!'", 0)
    write_guest_disk(vm, "text0", "head -c 4M /dev/urandom", 1)
    checksum = vm.exec(f"sha256sum {device}").stdout.split()[0]
    expect_error(
        lambda: enable(agent, device=pb.DeviceSelector(serial="text0")),
        grpc.StatusCode.FAILED_PRECONDITION,
        f"{device} is neither blank nor swap: it has data at byte offset 0;",
        "pass force",
    )
    assert vm.exec(f"sha256sum {device}").stdout.split()[0] == checksum
    assert rotational(vm, "text0") == "1"
    assert "text0" not in read_guest(vm, "/proc/swaps") and device not in read_guest(
        vm, "/proc/swaps"
    )


def test_data_only_in_the_middle_is_found(vm: GuestVM, agent: AgentClient) -> None:
    device = write_guest_disk(vm, "mid0", "head -c 1M /dev/urandom", 40)
    expect_error(
        lambda: enable(agent, device=pb.DeviceSelector(serial="mid0")),
        grpc.StatusCode.FAILED_PRECONDITION,
        f"{device} is neither blank nor swap: it has data at byte offset {40 * MIB};",
    )
    assert device not in read_guest(vm, "/proc/swaps")


def test_force_still_formats_unknown_data(vm: GuestVM, agent: AgentClient) -> None:
    area = enable(agent, device=pb.DeviceSelector(serial="text0"), force=True)
    assert area.formatted and area.device == node_of(vm, "text0")
    assert "TYPE=swap" in vm.exec(["blkid", "-o", "export", area.device]).stdout
    agent.disable_swap(pb.DeviceSelector(serial="text0"))


# The blank check alone, run in the guest on a cold page cache: what EnableSwap adds.
SCAN = """
import os, sys, time
from guestagent.linux.blockdev import first_data_offset
fd = os.open(sys.argv[1], os.O_RDONLY)
started = time.monotonic()
found = first_data_offset(fd)
print(found, time.monotonic() - started)
"""


def test_an_8gib_blank_disk_is_checked_quickly(vm: GuestVM, agent: AgentClient) -> None:
    vm.exec("echo 3 > /proc/sys/vm/drop_caches")
    found, seconds = vm.exec(
        ["/opt/guestagent/bin/python", "-c", SCAN, node_of(vm, "big0")]
    ).stdout.split()
    assert found == "None"
    RESULTS["blank_check_8gib_seconds"] = round(float(seconds), 3)
    print(f"8 GiB blank disk: the blank check alone took {float(seconds):.3f} s")
    # Data in the last MiB only: the refusal reads the whole sampling plan first.
    device = write_guest_disk(vm, "big0", "printf 'the end'", (8 << 10) - 1)
    started = time.monotonic()
    expect_error(
        lambda: enable(agent, device=pb.DeviceSelector(serial="big0")),
        grpc.StatusCode.FAILED_PRECONDITION,
        f"{device} is neither blank nor swap: it has data at byte offset {(8 << 30) - MIB};",
    )
    refused = time.monotonic() - started
    write_guest_disk(vm, "big0", "head -c 1M /dev/zero", (8 << 10) - 1)
    started = time.monotonic()
    area = enable(agent, device=pb.DeviceSelector(serial="big0"), discard=pb.DISCARD_NONE)
    enabled = time.monotonic() - started
    RESULTS["blank_check_8gib_refusal_seconds"] = round(refused, 3)
    RESULTS["enable_8gib_blank_seconds"] = round(enabled, 3)
    print(f"8 GiB disk: refusal after the full blank check {refused:.3f} s, enable {enabled:.3f} s")
    assert area.formatted and area.size_bytes > 7 << 30
    agent.disable_swap(pb.DeviceSelector(serial="big0"))
