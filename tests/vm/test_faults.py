"""Faults in a real guest: the agent killed while enabling swap, a swap disk pulled out
while active. Each ends in a clear error or a consistent state that the agent reports."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.linux.swaps import parse_proc_swaps
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import boot, read_guest, wait_until
from tests.vm.pace import Pace

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    config = VMConfig(memory_mib=512, disks=(Disk("big", 8 << 30, serial="big0"),))
    yield from boot(config, image, tmp_path_factory)


def active_devices(vm: GuestVM) -> set[str]:
    return {a.filename for a in parse_proc_swaps(read_guest(vm, "/proc/swaps").encode())}


def test_agent_killed_while_enabling_swap_restarts_into_the_truth(
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> None:
    disk = vm.exec(["readlink", "-f", "/dev/disk/by-id/virtio-big0"]).stdout.strip()
    rotational = f"/sys/block/{disk.removeprefix('/dev/')}/queue/rotational"
    outcome: dict[str, object] = {}

    def enable() -> None:
        try:
            outcome["area"] = agent.enable_swap(
                pb.EnableSwapRequest(device=pb.DeviceSelector(serial="big0"))
            )
        except grpc.RpcError as e:
            outcome["error"] = e.code()

    caller = threading.Thread(target=enable)
    caller.start()
    # Kill it mid-way: once it has cleared the rotational flag, the step just before mkswap
    # and swapon. The wait runs in the guest, so no host round trip lets the call finish
    # first; a run of the call that does finish first is still a valid outcome below.
    seconds = pace.scale(60)
    killed = vm.exec(
        f"timeout {seconds:.0f} sh -c 'until read -r r <{rotational} && [ $r = 0 ]; "
        "do sleep 0.02; done' "
        "&& pkill -KILL -x guestagent",
        timeout=seconds + 10,
        check=False,
    )
    assert killed.rc == 0, f"the agent never cleared {rotational} ({outcome}): {killed}"
    caller.join(timeout=pace.scale(120))
    agent.wait_ready(pace.scale(120))  # init respawns it
    # Whatever point the kill hit, the restarted agent reports what the kernel holds...
    listed = {a.device for a in agent.list_swaps()}
    assert listed == active_devices(vm), outcome
    # ...and enabling again ends in an active, non-rotational area.
    area = agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="big0")))
    assert area.device in active_devices(vm)
    assert not area.rotational
    assert area.already_active == bool(listed), (outcome, listed)


def test_a_swap_disk_pulled_out_while_active(
    vm: GuestVM, agent: AgentClient, tmp_path: Path, pace: Pace
) -> None:
    backing = tmp_path / "pulled.raw"
    with open(backing, "wb") as f:
        f.truncate(256 * MIB)
    vm.qmp(
        "blockdev-add",
        **{
            "driver": "raw",
            "node-name": "pull0",
            "file": {"driver": "file", "filename": str(backing)},
        },
    )
    vm.qmp("device_add", driver="virtio-blk-pci", drive="pull0", serial="pull0", id="pulldisk")
    area = agent.enable_swap(
        pb.EnableSwapRequest(device=pb.DeviceSelector(serial="pull0"), wait_ms=60_000)
    )
    vm.qmp("device_del", id="pulldisk")
    wait_until(
        lambda: vm.exec(["test", "-e", area.device], check=False).rc != 0,
        pace.scale(60),
        f"{area.device} to go",
    )
    # The kernel keeps the area until swapoff; the agent reports it without failing.
    assert agent.info().system.swap_total_bytes > 0
    reported = {a.device for a in agent.list_swaps()}
    assert reported == active_devices(vm)
    assert f"{area.device} (deleted)" in reported
    with pytest.raises(grpc.RpcError) as raised:
        agent.disable_swap(pb.DeviceSelector(serial="pull0"))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert "pull0" in (raised.value.details() or "")
    assert f"{area.device} (deleted)" in (raised.value.details() or "")
