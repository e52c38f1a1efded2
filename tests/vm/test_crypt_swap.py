"""Encrypted swap in a real guest: dm-crypt over a sparse host file, the host's view of it.

One boot. A workload writes a known 64-byte marker over 200 MiB in a 32 MiB cgroup; the host
searches its whole swap file for the marker: none with EPHEMERAL, plenty with NONE (the
control that proves the search finds it). Then discard through dm-crypt, a restart with the
mapping active, a stale mapping removed at start, an agent told --confidential=yes refusing
NONE, and a kernel without dm_crypt loaded.
"""

from __future__ import annotations

import json
import os
import secrets
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
    allocated_after_release,
    boot,
    expect_error,
    kill_agent,
    make_cgroup,
    node_of,
    read_guest,
    rotational,
    stop_filler,
    wait_until,
)

pytestmark = pytest.mark.vm

DISKS = (
    Disk("crypt", 512 * MIB, serial="crypt0"),
    Disk("plain", 512 * MIB, serial="plain0"),
    Disk("keep", 64 * MIB, serial="keep0"),
    Disk("stale", 64 * MIB, serial="stale0"),
)
FILL_MIB = 200
MARKER = secrets.token_bytes(64)
RESULTS: dict[str, object] = {}

# Fills MiB of anonymous memory with the marker, says so in a file, then sleeps until killed.
# Repeating a bytearray writes each page once: bytearray(size) would zero every page first,
# swap it out, and swap it back in to write the marker.
MARKER_FILLER = """
import sys, time
marker = bytes.fromhex(sys.argv[1])
block = bytearray(marker) * ((int(sys.argv[2]) << 20) // len(marker))
open(sys.argv[3], "w").write("ready")
time.sleep(3600)
"""


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    yield from boot(VMConfig(memory_mib=512, disks=DISKS), image, tmp_path_factory)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "crypt_swap.json").write_text(json.dumps(RESULTS, indent=2) + "\n")


def enable(agent: AgentClient, serial: str, encryption: int) -> pb.SwapArea:
    return agent.enable_swap(
        pb.EnableSwapRequest(device=pb.DeviceSelector(serial=serial), encryption=encryption)  # type: ignore[arg-type]
    )


def count_in_file(path: Path, needle: bytes) -> int:
    """Occurrences of needle in a sparse file, reading only its data extents."""
    count, chunk = 0, 8 * MIB
    with open(path, "rb") as f:
        fd, size, offset = f.fileno(), os.fstat(f.fileno()).st_size, 0
        while offset < size:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after offset.
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            tail = b""
            for position in range(start, end, chunk):
                data = tail + os.pread(fd, min(chunk, end - position), position)
                count += data.count(needle)
                tail = data[-(len(needle) - 1) :]
            offset = end
    return count


def pswpout(vm: GuestVM) -> int:
    for line in read_guest(vm, "/proc/vmstat").splitlines():
        name, value = line.split()
        if name == "pswpout":
            return int(value)
    raise AssertionError("no pswpout in /proc/vmstat")


def marker_run(vm: GuestVM, disk: str, cgroup: str) -> dict[str, float]:
    """The marker workload in a 32 MiB cgroup: the marker copies in the host's file while it
    lives in swap, then how much of what the file gained the host gets back after it ends."""
    speed = pace.of(vm)
    make_cgroup(vm, cgroup, memory_max="32M")
    before = vm.disk_allocated_bytes(disk)
    out_before = pswpout(vm)
    marker = f"/run/{cgroup}.ready"
    vm.exec(["sh", "-c", "cat > /run/marker.py"], stdin=MARKER_FILLER)
    vm.exec(
        f"sh -c 'echo $$ > /sys/fs/cgroup/{cgroup}/cgroup.procs; echo $$ > /run/filler.pid; "
        f"exec python3 /run/marker.py {MARKER.hex()} {FILL_MIB} {marker}' "
        "</dev/null >/run/filler.log 2>&1 &"
    )
    wait_until(
        lambda: vm.exec(["test", "-e", marker], check=False).rc == 0,
        speed.scale(600),
        "the marker filler to fill its memory",
    )
    swap_current = f"/sys/fs/cgroup/{cgroup}/memory.swap.current"
    swapped = int(read_guest(vm, swap_current))
    pages_out = pswpout(vm) - out_before
    peak = vm.disk_allocated_bytes(disk)
    copies = count_in_file(vm.disk_path(disk), MARKER)
    stop_filler(vm)
    after = allocated_after_release(vm, swap_current, swapped, disk)
    gained = peak - before
    return {
        "marker_copies": copies,
        "pswpout_pages": pages_out,
        "swapped_mib": round(swapped / MIB, 1),
        "allocated_before_mib": round(before / MIB, 1),
        "allocated_peak_mib": round(peak / MIB, 1),
        "allocated_after_mib": round(after / MIB, 1),
        "released_fraction_of_gain": round((peak - after) / gained, 3) if gained else 0.0,
    }


def mapping_names(vm: GuestVM) -> list[str]:
    names = vm.exec("cat /sys/block/dm-*/dm/name 2>/dev/null; true").stdout
    return names.split()


def test_not_confidential_under_tcg(agent: AgentClient) -> None:
    info = agent.info()
    assert info.confidential.platform == "none", info.confidential
    assert "no SEV-SNP or TDX" in info.confidential.evidence


def test_ephemeral_swap_hides_the_marker_and_still_discards(
    vm: GuestVM, agent: AgentClient
) -> None:
    area = enable(agent, "crypt0", pb.SWAP_ENCRYPTION_EPHEMERAL)
    disk = node_of(vm, "crypt0")
    name = f"guestagent-swap-{disk.removeprefix('/dev/')}"
    assert area.encrypted and area.formatted and not area.already_active
    assert (area.mapping, area.backing_device) == (f"/dev/mapper/{name}", disk)
    assert area.device.startswith("/dev/dm-") and area.discard_supported
    dm = area.device.removeprefix("/dev/")
    assert read_guest(vm, f"/sys/block/{dm}/dm/name").strip() == name
    assert rotational(vm, "crypt0") == "0" and not area.rotational
    assert read_guest(vm, f"/sys/block/{dm}/queue/rotational").strip() == "0"
    assert area.device in read_guest(vm, "/proc/swaps")

    swaps = read_guest(vm, "/proc/swaps")
    again = enable(agent, "crypt0", pb.SWAP_ENCRYPTION_EPHEMERAL)
    assert again.already_active and again.encrypted and again.device == area.device
    assert read_guest(vm, "/proc/swaps") == swaps
    expect_error(
        lambda: enable(agent, "crypt0", pb.SWAP_ENCRYPTION_NONE),
        grpc.StatusCode.FAILED_PRECONDITION,
        "already active swap encrypted",
    )

    figures = marker_run(vm, "crypt", "crypt")
    RESULTS["ephemeral"] = figures
    print(f"EPHEMERAL: {figures}")
    assert figures["pswpout_pages"] * 4096 > 150 * MIB, figures  # The pages went out...
    assert figures["allocated_peak_mib"] > 150, figures  # ...to the host's file...
    assert figures["marker_copies"] == 0, figures  # ...and the host cannot read them.
    assert figures["released_fraction_of_gain"] >= 0.95, figures


def test_disable_removes_the_mapping(vm: GuestVM, agent: AgentClient) -> None:
    area = agent.disable_swap(pb.DeviceSelector(serial="crypt0"))
    assert area.encrypted and area.mapping.endswith("-" + node_of(vm, "crypt0")[5:])
    assert not [n for n in mapping_names(vm) if n.startswith("guestagent-swap-")]
    assert area.device not in read_guest(vm, "/proc/swaps")


def test_none_is_the_control_the_marker_is_found(vm: GuestVM, agent: AgentClient) -> None:
    area = enable(agent, "plain0", pb.SWAP_ENCRYPTION_NONE)
    assert not area.encrypted and area.device == node_of(vm, "plain0") and not area.mapping
    figures = marker_run(vm, "plain", "plain")
    RESULTS["none"] = figures
    print(f"NONE: {figures}")
    agent.disable_swap(pb.DeviceSelector(serial="plain0"))
    assert figures["pswpout_pages"] * 4096 > 150 * MIB, figures
    assert figures["marker_copies"] > 1000, figures


def test_a_restarted_agent_reports_its_mapping(vm: GuestVM, agent: AgentClient) -> None:
    # The disk was discarded whole when its mapping went: it reads blank again.
    area = enable(agent, "crypt0", pb.SWAP_ENCRYPTION_EPHEMERAL)
    assert area.encrypted and area.formatted
    kill_agent(vm)
    agent.wait_ready(pace.of(vm).scale(90))
    listed = {a.device: a for a in agent.list_swaps()}
    found = listed[area.device]
    assert found.encrypted and found.mapping == area.mapping
    assert found.backing_device == node_of(vm, "crypt0") and found.discard == pb.DISCARD_BOTH
    again = enable(agent, "crypt0", pb.SWAP_ENCRYPTION_DEFAULT)
    assert again.already_active and again.encrypted and again.device == area.device


# What an agent killed between the table load and swapon leaves: a live mapping, no swap.
LEFTOVER = """
import sys
from guestagent.linux.dm import DeviceMapper, crypt_table
from guestagent.linux.fs import KernelFS
major, minor = map(int, sys.argv[2].split(":"))
mapper = DeviceMapper(KernelFS())
mapper.create(sys.argv[1])
mapper.load_crypt(sys.argv[1], crypt_table(int(sys.argv[3]) * 512, 512, major, minor))
mapper.resume(sys.argv[1])
"""


def test_a_mapping_without_swap_is_removed_at_start(vm: GuestVM, agent: AgentClient) -> None:
    disk = node_of(vm, "stale0").removeprefix("/dev/")
    name = f"guestagent-swap-{disk}"
    dev = read_guest(vm, f"/sys/block/{disk}/dev").strip()
    sectors = read_guest(vm, f"/sys/block/{disk}/size").strip()
    vm.exec(["/opt/guestagent/bin/python", "-c", LEFTOVER, name, dev, sectors])
    assert name in mapping_names(vm)
    kill_agent(vm)
    agent.wait_ready(pace.of(vm).scale(90))
    assert name not in mapping_names(vm)
    log = read_guest(vm, "/var/log/guestagent.log")
    assert any("stale_mapping_removed" in line and name in line for line in log.splitlines())
    # The active encrypted area survived the same start.
    assert any(a.encrypted for a in agent.list_swaps())


AGENT = "/opt/guestagent/bin/guestagent"
SOCKET = "/run/confidential.sock"


def test_a_confidential_agent_refuses_swap_in_the_clear(vm: GuestVM) -> None:
    vm.exec(
        f"{AGENT} serve --listen unix://{SOCKET} --confidential=yes --no-self-cgroup "
        "--online-memory off </dev/null >/run/confidential.log 2>&1 & echo $! > /run/conf.pid"
    )
    guestctl = ["/usr/local/bin/guestctl", "--target", f"unix://{SOCKET}", "--timeout", "60"]
    try:
        wait_until(
            lambda: vm.exec([*guestctl, "info"], check=False, timeout=120).rc == 0,
            pace.of(vm).scale(120),
            "the --confidential=yes agent to answer",
        )
        info = vm.exec([*guestctl, "info"], timeout=120).stdout
        assert "guest    confidential other (--confidential=yes)" in info, info
        refused = vm.exec(
            [*guestctl, "swap", "enable", "--serial", "keep0", "--encryption", "none"],
            check=False,
            timeout=120,
        )
        assert refused.rc != 0, refused
        assert "FAILED_PRECONDITION" in refused.stderr + refused.stdout, refused
        assert "confidential guest (other, from --confidential=yes)" in refused.stderr, refused
    finally:
        vm.exec("kill $(cat /run/conf.pid); true")
    assert vm.disk_allocated_bytes("keep") == 0  # Not one block written.
    assert rotational(vm, "keep0") == "1"


def test_without_dm_crypt_the_disk_is_refused_untouched(vm: GuestVM, agent: AgentClient) -> None:
    agent.disable_swap(pb.DeviceSelector(serial="crypt0"))
    vm.exec(["rmmod", "dm_crypt"])
    try:
        before = vm.disk_allocated_bytes("keep")
        expect_error(
            lambda: enable(agent, "keep0", pb.SWAP_ENCRYPTION_EPHEMERAL),
            grpc.StatusCode.FAILED_PRECONDITION,
            node_of(vm, "keep0"),
            "dm_crypt is not loaded",
        )
        assert vm.disk_allocated_bytes("keep") == before == 0
        assert rotational(vm, "keep0") == "1"
        assert not [n for n in mapping_names(vm) if n.startswith("guestagent-swap-")]
    finally:
        vm.exec(["modprobe", "dm_crypt"])
