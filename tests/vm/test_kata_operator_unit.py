"""The unit the Kata extension ships for operators, started by systemd in the Kata-like guest.

Today's kata-agent launches processes only from the extension named coco, so an operator with
a systemd base image installs the extension's etc/systemd/system/guestagent-extension.service
and enables it (docs/kata-extension.md). This boot is that guest: the kata-agent stand-in
launches only from coco (kata.test.launch_only=coco), and a test-only unit
(image/kata/kata-test-operator-unit.service) installs the mounted image's own unit into
/etc/systemd/system, enables and starts it, once the extension is verified and mounted. An
operator does that in the base image before boot: the unit's content and its start are
tested here, not its place in the boot order. The guest has no python, so no command channel:
what is checked, the agent reports, and the console shows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.ops.self_cgroup import MEMORY_HIGH
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import wait_until
from tests.vm.kata import MOUNTED, booted, extension_disk, extension_image_path, serving

pytestmark = pytest.mark.vm

UNIT_CGROUP = "system.slice/guestagent-extension.service"
SWAP_DISK = Disk("swap", 256 << 20, serial="swap0")
INSTALLED = "kata-test-operator-unit: guestagent-extension.service enabled and started"
NOT_LAUNCHED = "kata-agent-standin: guestagent: nothing launched (only coco's processes are)"


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    config = VMConfig(
        flavour="kata",
        disks=(SWAP_DISK,),
        readonly_disks=(extension_disk(extension_image_path(image)),),
        extra_cmdline="kata.test.launch_only=coco kata.test.operator_unit",
    )
    with booted(config, image, tmp_path_factory.mktemp("kata-operator-unit")) as guest:
        yield guest


@pytest.fixture(scope="module")
def agent(vm: GuestVM) -> Iterator[AgentClient]:
    with serving(vm) as client:
        yield client


def test_the_operator_unit_starts_the_agent_that_kata_agent_does_not(
    vm: GuestVM, agent: AgentClient
) -> None:
    console = wait_until(
        lambda: text if INSTALLED in (text := vm.console_log()) else None,
        30,
        "the test unit to say it started the operator unit",
    )
    assert MOUNTED in console
    assert NOT_LAUNCHED in console
    assert "guestagent: starting" not in console  # The stand-in's launch line.
    assert agent.health("guestagent.v1.MemoryAgent") == "SERVING"


def test_the_agent_runs_in_the_units_cgroup_with_its_bounds(agent: AgentClient) -> None:
    """Started by systemd, the agent stays in its unit's cgroup, bounded by the unit's
    MemoryHigh= (the bundle's, which the agent's own cgroup would have), and makes none of its
    own as it does under kata-agent."""
    (unit,) = agent.info(cgroups=[UNIT_CGROUP]).cgroups
    assert unit.current_bytes > 0
    assert unit.high.bytes == MEMORY_HIGH
    with pytest.raises(grpc.RpcError) as missing:
        agent.info(cgroups=["guestagent"])
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_swap_by_serial_under_the_units_hardening(agent: AgentClient) -> None:
    """mkswap from the extension, swapon(2) through the unit's system call filter, the swap
    policy kept in its RuntimeDirectory, with no udevd in this guest."""
    area = agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
    assert area.formatted and area.device == "/dev/vdb"
    listed = {a.device: a for a in agent.list_swaps()}[area.device]
    assert listed.size_bytes > 200 * MIB and listed.uuid == area.uuid
