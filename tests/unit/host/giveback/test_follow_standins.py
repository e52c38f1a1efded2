"""`guestctl give-back --follow` through the Cloud Hypervisor and Firecracker stand-ins
(tests/standins/: each VMM's documented API on a unix socket, turned into QMP commands) over
the fake QEMU monitor, against an agent whose reports follow the balloon: the follow scenario
of tests/vm/test_giveback_follow.py as the VMM's API sees it. The loop takes the agent's
figure through the API once it has held, gives memory back as the guest grows, ends at the
figure, and stops on SIGTERM leaving the balloon where it is; every body the stand-in received
is valid by the VMM's published schema. What the guest then does with the memory (the VMM's
RSS fall, the hot loop's pace, no OOM kill) is the QEMU balloon's either way: the QEMU test
checks it in a real guest."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from guestagent.host.units import round_down
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.v1 import agent_pb2_grpc as pb_grpc
from tests.fakes.giveback import report
from tests.fakes.qmp import FakeQemu
from tests.standins import schema
from tests.standins.cloud_hypervisor import CloudHypervisorStandIn
from tests.standins.firecracker import FirecrackerStandIn
from tests.standins.server import StandIn
from tests.vm.guest import wait_until
from tests.workloads.giveback import GROW_MIB, FollowProcess

# A report every 0.1 s (the least guestctl asks for) and a 0.5 s hold: the VM test's 2 s and
# 10 s wait on a guest's aging, which a scripted agent does not have.
FOLLOW_ARGS = ("--follow", "--interval", "0.1", "--hold", "0.5")
# What the guest needs before it grows, in MemTotal terms: not a whole MiB, so Firecracker's
# MiB and Cloud Hypervisor's 4 KiB pages take different sizes for the same figure.
NEED = 600 * MIB + 12 * 1024
# The share of the time a guest short of memory stalls: over twice the loop's 10 % threshold.
STALL_WHEN_SHORT = 0.25
# Long for steps a second apart, for a host whose cores other work holds.
WAIT_S = 60.0


@dataclass
class Guest:
    """The guest the agent reports on: MemTotal is what QEMU's balloon leaves it (deflate-on-
    oom off), and it needs `need`; short of that it has nothing free and stalls."""

    qemu: FakeQemu
    need: int
    stalled_us: float = 0.0
    at: float = field(default_factory=time.monotonic)

    def report(self) -> pb.MemoryInfo:
        now, mem_total = time.monotonic(), self.qemu.actual
        if self.need > mem_total:
            self.stalled_us += (now - self.at) * STALL_WHEN_SHORT * 1e6
        self.at = now
        # The agent's target is capped at MemTotal (ops/giveback_figures.py).
        info = report(mem_total, min(self.need, mem_total))
        info.system.mem_free_bytes = max(0, mem_total - self.need)
        info.pressure.some.total_us = int(self.stalled_us)
        return info


class ReportingAgent(pb_grpc.MemoryAgentServicer):
    """The calls give-back --follow makes: WatchMemory, the guest's report at the asked
    interval, and Compact."""

    def __init__(self, guest: Guest) -> None:
        self.guest = guest

    def WatchMemory(
        self, request: pb.WatchMemoryRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.MemoryInfo]:
        while context.is_active():
            yield self.guest.report()
            time.sleep(request.interval_ms / 1000)

    def Compact(
        self, request: pb.CompactRequest, context: grpc.ServicerContext
    ) -> pb.CompactResult:
        return pb.CompactResult()


@pytest.fixture
def qemu(tmp_path: Path) -> Iterator[FakeQemu]:
    with FakeQemu(tmp_path / "qmp.sock") as fake:
        yield fake


@pytest.fixture
def guest(qemu: FakeQemu) -> Guest:
    return Guest(qemu, NEED)


@pytest.fixture
def agent_target(guest: Guest, tmp_path: Path) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    # The generated stubs call the methods it leaves out abstract; gRPC answers them
    # UNIMPLEMENTED.
    agent = ReportingAgent(guest)  # type: ignore[abstract]
    pb_grpc.add_MemoryAgentServicer_to_server(agent, server)
    target = f"unix://{tmp_path / 'agent.sock'}"
    server.add_insecure_port(target)
    server.start()
    yield target
    server.stop(0)


def taken(qemu: FakeQemu) -> int:
    """What QEMU's balloon holds."""
    return qemu.ram_size - qemu.actual


@dataclass(frozen=True)
class Holds:
    """What the balloon holds against the figure: true once it is there."""

    taken: int
    figure: int

    def __bool__(self) -> bool:
        return self.taken == self.figure


def writes(stand_in: StandIn) -> list[Any]:
    return [r.body for r in stand_in.received if r.method != "GET"]


@dataclass(frozen=True)
class Vmm:
    name: str
    kind: type[StandIn]
    unit: int  # The API's balloon size unit.
    resize: str  # The request that sizes the balloon,
    body: Callable[[int], dict[str, int]]  # with the body that asks for bytes taken.
    reads: tuple[str, ...]  # What the loop must read the balloon back through.


VMMS = [
    Vmm(
        schema.CLOUD_HYPERVISOR,
        CloudHypervisorStandIn,
        4096,
        "PUT /api/v1/vm.resize",
        lambda taken: {"desired_balloon": taken},
        ("GET /api/v1/vm.info",),
    ),
    Vmm(
        schema.FIRECRACKER,
        FirecrackerStandIn,
        MIB,
        "PATCH /balloon",
        lambda taken: {"amount_mib": taken // MIB},
        ("GET /balloon", "GET /balloon/statistics"),
    ),
]


@pytest.mark.parametrize("vmm", VMMS, ids=[v.name for v in VMMS])
def test_follow_through_a_stand_in(
    vmm: Vmm, qemu: FakeQemu, guest: Guest, agent_target: str, tmp_path: Path
) -> None:
    def at_figure(need: int) -> int:
        """What the balloon may hold while the guest needs `need`, in the API's unit."""
        return round_down(qemu.ram_size - need, vmm.unit)

    with vmm.kind(tmp_path / "api.sock", qemu.path) as stand_in:
        api = ("--vmm", vmm.name, "--api", str(stand_in.api_path))
        follow = FollowProcess.start(agent_target, *api, follow_args=FOLLOW_ARGS)
        try:
            wait_until(
                lambda: follow.alive() and Holds(taken(qemu), at_figure(NEED)),
                WAIT_S,
                "the balloon at the figure",
                every=0.05,
            )
            deflates_before = len(follow.changes("deflate"))
            guest.need = NEED + GROW_MIB * MIB  # The workload grows.
            wait_until(
                lambda: follow.alive() and Holds(taken(qemu), at_figure(guest.need)),
                WAIT_S,
                "the balloon at the figure once the guest has grown",
                every=0.05,
            )
        finally:
            at_stop, written = taken(qemu), len(writes(stand_in))
            rc, err = follow.stop()
    events = [{k: v for k, v in e.items() if k != "policy"} for e in follow.events]
    changes = [e for e in events if e["event"] in ("inflate", "deflate")]

    # Taken once the figure held, to the figure in the API's unit, through the API.
    assert changes, events
    first = changes[0]
    assert (first["event"], first["cause"], first["asked"]) == (
        "inflate",
        "held",
        at_figure(NEED),
    ), events
    # Every change asked through the API in its terms, and nothing else written.
    assert writes(stand_in) == [vmm.body(e["asked"]) for e in changes], events
    # Let out as the guest grew: given back for the guest, not for a stuck balloon, until it
    # had its memory; then the balloon at the figure again (the waits above).
    let_out = [e for e in changes if e["event"] == "deflate"][deflates_before:]
    assert let_out and {e["cause"] for e in let_out} <= {"stall", "saturated", "figure"}, events
    assert min(e["asked"] for e in let_out) <= at_figure(guest.need), events
    # Stopped cleanly on SIGTERM, the balloon left where it was.
    assert rc == 0, err
    last = events[-1]
    assert last["event"] == "stopped" and "left where it is" in last["note"], events
    assert last["left_taken"] == at_stop == taken(qemu), events
    assert len(writes(stand_in)) == written, events
    # What the stand-in received: the VMM's endpoints, every body valid by its schema.
    requests = {f"{r.method} {r.path}" for r in stand_in.received}
    assert {vmm.resize, *vmm.reads} <= requests, requests
    assert schema.received_errors(vmm.name, stand_in.received) == []
