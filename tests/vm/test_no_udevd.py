"""The agent in a guest without udevd, as in Kata's initrd and minimal roots: disks found by
their sysfs serial, hot-plugged disks and memory seen from the kernel's own uevents.

The guest's udevd keeps running for the rest of the image; the agent under test runs in a
mount namespace whose /run/udev is an empty tmpfs, so it finds neither udevd's control
socket nor its database. The image's own agent has onlining off, so any block that comes
online was onlined by the agent under test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import boot, guestctl, wait_until
from tests.vm.pace import Deadline, Pace

pytestmark = pytest.mark.vm

SOCKET = "unix:///run/agent-noudev.sock"
HOTPLUGGED = Disk("late", 256 << 20, serial="late0")


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    config = VMConfig(slots=2, maxmem_mib=1024, agent_args=("--online-memory", "off"))
    yield from boot(config, image, tmp_path_factory)


@pytest.fixture(scope="module")
def agent_without_udevd(vm: GuestVM, pace: Pace) -> Iterator[str]:
    vm.exec(
        "unshare --mount sh -c 'mount -t tmpfs none /run/udev && exec "
        f"/opt/guestagent/bin/guestagent serve --listen {SOCKET}' "
        "</dev/null >/run/agent-noudev.log 2>&1 & echo $! > /run/agent-noudev.pid"
    )
    starting = Deadline(pace.scale(90))
    wait_until(
        lambda: guestctl(vm, SOCKET, "health", deadline=starting).rc == 0,
        starting.remaining(),
        "the agent without udevd to serve",
    )
    yield SOCKET
    vm.exec("kill $(cat /run/agent-noudev.pid); true")


def test_a_hot_plugged_disk_is_found_by_its_sysfs_serial(
    vm: GuestVM, pace: Pace, agent_without_udevd: str
) -> None:
    # The call waits for the disk; the disk arrives while it waits.
    vm.exec(
        f"/usr/local/bin/guestctl --target {agent_without_udevd} --json --timeout 300 "
        f"swap enable --serial {HOTPLUGGED.serial} --wait-ms 120000 "
        ">/run/late.json 2>/run/late.err & echo $! > /run/late.pid"
    )
    vm.hotplug_disk(HOTPLUGGED)
    wait_until(
        lambda: vm.exec("test -s /run/late.json || test -s /run/late.err", check=False).rc == 0,
        pace.scale(180),
        "EnableSwap on the hot-plugged disk to answer",
    )
    assert vm.exec(["cat", "/run/late.err"]).stdout == ""
    area = json.loads(vm.exec(["cat", "/run/late.json"]).stdout)
    node = area["device"]
    sysname = node.removeprefix("/dev/")
    assert vm.exec(["cat", f"/sys/block/{sysname}/serial"]).stdout.strip() == HOTPLUGGED.serial
    assert area["formatted"] and area["discard"] == "DISCARD_BOTH", area
    assert area["discard_supported"] and area["rotational"] is False, area
    assert vm.exec(["cat", f"/sys/block/{sysname}/queue/rotational"]).stdout.strip() == "0"
    swaps = vm.exec(["cat", "/proc/swaps"]).stdout
    assert node in swaps, swaps


def test_hot_plugged_memory_is_onlined_from_kernel_uevents(
    vm: GuestVM, pace: Pace, agent_without_udevd: str
) -> None:
    def count(state: str) -> int:
        command = f"grep -lx {state} /sys/devices/system/memory/memory*/state | wc -l"
        return int(vm.exec(command).stdout)

    online_before = count("online")
    assert count("offline") == 0
    vm.hotplug_dimm(128)
    wait_until(
        lambda: count("online") > online_before and count("offline") == 0,
        pace.scale(120),
        "the DIMM's blocks to come online",
    )
    log = vm.exec(["cat", "/run/agent-noudev.log"]).stdout
    assert "Traceback" not in log, log
