"""The agent as a Kata guest extension, in a guest this project did not design.

The guest (image/kata/) is Debian trixie from mmdebstrap --variant=required with systemd as
PID 1 and no python, no udevd and no mkswap. The extension image is attached read-only with
serial extension-guestagent and its verity params on the kernel command line; the guest's
kata-extension-mount@guestagent.service verifies and mounts it, a stand-in for kata-agent
starts the agent from its components.toml, and the host reaches it over tcp relayed by socat
to vsock loopback. Then the same image, one byte flipped, must never serve.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestagent.build.extension import FIRST_PARTITION_OFFSET, PREFIX, VerityParams
from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, ReadOnlyDisk, VMConfig
from guestagent.ops.self_cgroup import MEMORY_HIGH
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import wait_until
from tests.vm.kata import (
    BOOT_SECONDS,
    MOUNTED,
    booted,
    extension_disk,
    extension_image_path,
    serving,
)

pytestmark = pytest.mark.vm

WORKLOAD = "system.slice/kata-test-workload.service"
SWAP_DISK = Disk("swap", 256 << 20, serial="swap0")
# The second disk, after the root (vda) and swap0 (vdb); the extension comes last.
PATH_DISK = Disk("swap1", 128 << 20, serial="swap1")
PATH_DISK_NODE = "/dev/vdc"
SERVING = "kata-agent-standin: guestagent: /run/guestagent.sock is up"
# dm-verity's own report of a block whose hash does not match ("data block 2 is corrupted",
# "metadata block 6402 is corrupted").
VERITY_CORRUPTED = re.compile(r"device-mapper: verity: \S+: (data|metadata) block \d+ is corrupted")


def kata_config(extension: ReadOnlyDisk) -> VMConfig:
    return VMConfig(flavour="kata", disks=(SWAP_DISK, PATH_DISK), readonly_disks=(extension,))


@pytest.fixture(scope="module")
def extension_image(image: Path) -> Path:
    return extension_image_path(image)


@pytest.fixture(scope="module")
def vm(
    image: Path, extension_image: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GuestVM]:
    config = kata_config(extension_disk(extension_image))
    with booted(config, image, tmp_path_factory.mktemp("kata")) as guest:
        yield guest


@pytest.fixture(scope="module")
def agent(vm: GuestVM) -> Iterator[AgentClient]:
    with serving(vm) as client:
        yield client


def test_extension_verified_mounted_and_launched(vm: GuestVM, agent: AgentClient) -> None:
    # The agent may answer before the stand-in's next one-second poll sees its socket.
    console = wait_until(
        lambda: text if SERVING in (text := vm.console_log()) else None,
        30,
        "the stand-in to see the agent's socket",
    )
    assert MOUNTED in console
    assert f"guestagent: starting {PREFIX}/bin/guestagent serve --listen vsock://:6464" in console
    assert SERVING in console
    assert not VERITY_CORRUPTED.search(console)


def test_memory_info(agent: AgentClient) -> None:
    info = agent.info()
    assert info.system.mem_total_bytes > 256 * MIB
    assert 0 < info.system.mem_available_bytes <= info.system.mem_total_bytes


def test_the_agent_takes_its_own_cgroup_out_of_kata_agents(agent: AgentClient) -> None:
    """Started by kata-agent (the stand-in's service), the agent would share its cgroup and
    bounds: it moves to /guestagent with the same ceiling as under its own systemd unit."""
    (own,) = agent.info(cgroups=["guestagent"]).cgroups
    assert own.current_bytes > 0
    assert own.high.bytes == MEMORY_HIGH


def test_enable_swap_by_serial_without_udevd(agent: AgentClient) -> None:
    """No udevd, so no ID_SERIAL: the agent reads the serial from sysfs."""
    area = agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
    assert area.formatted and area.device == "/dev/vdb"
    assert area.discard == pb.DISCARD_BOTH and not area.rotational


def test_enable_swap_with_the_extensions_mkswap(agent: AgentClient) -> None:
    # The guest root has no mkswap (image/kata/rootfs.sh removes it and checks), so a
    # formatted area proves the agent ran its own, from the extension.
    request = pb.EnableSwapRequest(device=pb.DeviceSelector(path=PATH_DISK_NODE))
    area = agent.enable_swap(request)
    assert area.formatted and not area.already_active
    assert area.device == PATH_DISK_NODE
    assert area.discard_supported and area.discard == pb.DISCARD_BOTH
    assert area.HasField("rotational") and not area.rotational
    listed = {a.device: a for a in agent.list_swaps()}[area.device]
    assert listed.size_bytes > 100 * MIB and listed.uuid == area.uuid
    assert listed.discard == pb.DISCARD_BOTH and not listed.rotational


def test_set_memory_limits_on_the_workload(agent: AgentClient) -> None:
    applied = agent.set_limits(WORKLOAD, pb.LinuxMemory(limit=64 * MIB))
    assert applied.memory_max == str(64 * MIB)
    (cgroup,) = agent.info(cgroups=[WORKLOAD]).cgroups
    assert cgroup.path == WORKLOAD and cgroup.current_bytes > 0
    assert cgroup.max.bytes == 64 * MIB


def test_watch_memory_yields_an_update(agent: AgentClient) -> None:
    stream = agent.watch(cgroups=[WORKLOAD], interval_ms=500)
    try:
        first = next(iter(stream))
    finally:
        stream.cancel()
    assert first.system.mem_total_bytes > 0
    assert [c.path for c in first.cgroups] == [WORKLOAD]


def python_offset(image: Path, scratch: Path) -> int:
    """The disk offset of bin/python3.11's first compressed block: read at the agent's exec,
    never at mount (dump.erofs reads the EROFS partition's own extent map)."""
    data = scratch / "p1.erofs"
    params = VerityParams.parse(image.with_suffix(".verity-params").read_text())
    with image.open("rb") as disk, data.open("wb") as out:
        disk.seek(FIRST_PARTITION_OFFSET)
        out.write(disk.read(params.data_blocks * params.data_block_size))
    extents = subprocess.run(
        ["dump.erofs", "--path=/bin/python3.11", "-e", str(data)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"^\s*0:\s+0\.\.\s*\d+\s+\|\s+\d+\s+:\s+(\d+)\.\.", extents, re.MULTILINE)
    assert match, f"no first extent for bin/python3.11 in:\n{extents}"
    return FIRST_PARTITION_OFFSET + int(match.group(1))


def hash_partition_offset(image: Path) -> int:
    table = subprocess.run(
        ["sfdisk", "--json", str(image)], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r'"start":\s*(\d+),\s*"size":\s*\d+,\s*"type":\s*"83"\s*}\s*\]', table)
    assert match, table
    return int(match.group(1)) * 512


def flipped(image: Path, offset: int, dest: Path) -> Path:
    shutil.copyfile(image, dest)
    shutil.copyfile(image.with_suffix(".verity-params"), dest.with_suffix(".verity-params"))
    with dest.open("r+b") as disk:
        disk.seek(offset)
        byte = disk.read(1)[0]
        disk.seek(offset)
        disk.write(bytes([byte ^ 0xFF]))
    return dest


def boot_tampered(image_dir: Path, extension: Path, workdir: Path, done: re.Pattern[str]) -> str:
    """Boot with a tampered extension until the console shows `done` (or QEMU exits), and
    return the console log; the agent must never have served."""
    guest = GuestVM(kata_config(extension_disk(extension)), image_dir=image_dir, workdir=workdir)
    guest.start(wait=False)
    try:
        wait_until(
            lambda: done.search(guest.console_log()) or not guest.running,
            BOOT_SECONDS,
            f"the guest's console to show {done.pattern!r}",
        )
        console = guest.console_log()
    finally:
        guest.stop()
    assert SERVING not in console
    return console


def test_flipped_byte_in_the_interpreter_never_runs(
    image: Path, extension_image: Path, tmp_path: Path
) -> None:
    offset = python_offset(extension_image, tmp_path)
    tampered = flipped(extension_image, offset + 64, tmp_path / "tampered.img")
    console = boot_tampered(
        image, tampered, tmp_path, re.compile("kata-agent-standin: guestagent: start failed.*")
    )
    # The filesystem's own blocks are intact: the mount works, the read of python does not.
    assert MOUNTED in console
    assert VERITY_CORRUPTED.search(console), console[-3000:]
    assert re.search(r"guestagent: start failed: exited with 126", console)


def test_flipped_byte_in_the_hash_tree_is_refused(
    image: Path, extension_image: Path, tmp_path: Path
) -> None:
    tampered = flipped(
        extension_image, hash_partition_offset(extension_image) + 100, tmp_path / "t.img"
    )
    console = boot_tampered(image, tampered, tmp_path, re.compile(r"reboot: Power down"))
    assert MOUNTED not in console
    failed = re.search(r"Failed to start.*kata-extension-mount@guestagent\.service", console)
    assert failed or "kata-extension-mount: guestagent:" in console, console[-3000:]
    assert VERITY_CORRUPTED.search(console) or "Verification of root hash failed" in console, (
        console[-3000:]
    )
    assert "reboot: Power down" in console
