"""cgroup v2 limits from OCI values in a real guest: swap instead of OOM, OOM without swap,
and a real kernel write failure rolled back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import (
    boot,
    filler_ready,
    guestctl,
    read_guest,
    start_filler,
    stop_filler,
    wait_until,
)
from tests.vm.pace import Deadline, Pace

pytestmark = pytest.mark.vm

RB_SOCKET = "unix:///run/rb.sock"


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    config = VMConfig(memory_mib=512, disks=(Disk("swap", 1 << 30, serial="swap0"),))
    yield from boot(config, image, tmp_path_factory)


@pytest.fixture(scope="module", autouse=True)
def swap_on(agent: AgentClient) -> None:
    agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))


def cgroup_file(vm: GuestVM, cgroup: str, name: str) -> str:
    return read_guest(vm, f"/sys/fs/cgroup/{cgroup}/{name}").strip()


def events(vm: GuestVM, cgroup: str) -> dict[str, int]:
    text = read_guest(vm, f"/sys/fs/cgroup/{cgroup}/memory.events")
    return {k: int(v) for k, v in (line.split() for line in text.splitlines())}


def test_pod_and_container_are_created_with_limits(vm: GuestVM, agent: AgentClient) -> None:
    pod = agent.set_limits("pod", pb.LinuxMemory(limit=384 * MIB), create=True)
    assert pod.created and pod.memory_max == str(384 * MIB)
    ctr = agent.set_limits(
        "pod/ctr", pb.LinuxMemory(limit=64 * MIB, swap=256 * MIB, reservation=16 * MIB), create=True
    )
    assert ctr.created
    assert (ctr.memory_max, ctr.swap_max, ctr.memory_low) == (
        str(64 * MIB),
        str(192 * MIB),
        str(16 * MIB),
    )
    assert "memory" in cgroup_file(vm, "pod", "cgroup.subtree_control").split()
    assert cgroup_file(vm, "pod/ctr", "memory.swap.max") == str(192 * MIB)
    assert cgroup_file(vm, "pod/ctr", "memory.max") == str(64 * MIB)


def test_a_container_over_its_limit_swaps_instead_of_dying(
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> None:
    marker = start_filler(vm, "pod/ctr", 150, name="swapper")
    try:
        wait_until(
            lambda: filler_ready(vm, marker), pace.scale(300), "the filler to allocate 150 MiB"
        )
        swapped = int(cgroup_file(vm, "pod/ctr", "memory.swap.current"))
        assert swapped > 64 * MIB
        assert events(vm, "pod/ctr")["oom_kill"] == 0
        (reported,) = agent.info(["pod/ctr"]).cgroups
        assert reported.swap_current_bytes > 64 * MIB
    finally:
        stop_filler(vm, "swapper")


def test_with_no_swap_allowed_it_is_oom_killed(vm: GuestVM, agent: AgentClient, pace: Pace) -> None:
    applied = agent.set_limits(
        "pod/strict", pb.LinuxMemory(limit=64 * MIB, swap=64 * MIB), create=True
    )
    assert applied.swap_max == "0"
    start_filler(vm, "pod/strict", 150, name="strict")
    wait_until(lambda: events(vm, "pod/strict")["oom_kill"] >= 1, pace.scale(300), "the OOM kill")
    assert int(cgroup_file(vm, "pod/strict", "memory.swap.current")) == 0
    wait_until(
        lambda: cgroup_file(vm, "pod/strict", "cgroup.procs") == "",
        pace.scale(60),
        "the OOM-killed process to leave pod/strict",
    )


def test_a_failed_write_is_rolled_back(vm: GuestVM, agent: AgentClient, pace: Pace) -> None:
    # A real kernel refusal: memory.low made read-only, and a second agent without
    # CAP_DAC_OVERRIDE, so memory.swap.max and memory.max take the write and memory.low fails.
    agent.set_limits("pod/rb", pb.LinuxMemory(limit=-1), create=True)
    before = {
        f: cgroup_file(vm, "pod/rb", f) for f in ("memory.max", "memory.swap.max", "memory.low")
    }
    vm.exec("chmod 0444 /sys/fs/cgroup/pod/rb/memory.low")
    vm.exec(
        "setpriv --bounding-set -dac_override -- /opt/guestagent/bin/guestagent serve "
        "--online-memory off --listen unix:///run/rb.sock </dev/null >/run/rb.log 2>&1 & "
        "echo $! > /run/rb.pid"
    )
    try:
        # guestctl fails at once while the socket is missing; once it is there, a call waits
        # for the agent's SETTINGS frame up to what is left of the deadline.
        starting = Deadline(pace.scale(90))
        wait_until(
            lambda: guestctl(vm, RB_SOCKET, "health", deadline=starting).rc == 0,
            starting.seconds,
            "the unprivileged agent to serve on /run/rb.sock",
        )
        limits = ("--limit", "96M", "--swap", "128M", "--reservation", "16M")
        result = guestctl(
            vm,
            RB_SOCKET,
            "limits",
            "--cgroup",
            "pod/rb",
            *limits,
            deadline=Deadline(pace.scale(60)),
        )
    finally:
        vm.exec("kill $(cat /run/rb.pid); true")
    assert result.rc == 1, result
    message = result.stderr
    assert "ABORTED" in message and "memory.low" in message and "EACCES" in message, message
    assert "restored memory.max to max" in message and "restored memory.swap.max to max" in message
    after = {f: cgroup_file(vm, "pod/rb", f) for f in before}
    assert after == before
