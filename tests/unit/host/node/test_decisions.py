"""The node's decisions as tables: each VM's headroom (the host's pressure x its VMM's host
cgroup), what it sets up from the agent's GetAgentInfo, and its retries."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from guestagent.host.async_calls import AsyncCalls
from guestagent.host.giveback.follow import Reading
from guestagent.host.node.config import Guest, Host, NodePolicy
from guestagent.host.node.guest import (
    TRANSIENT,
    GuestLoop,
    HeadroomKnob,
    SetupPlan,
    reclaim_policy,
    retry_delay,
    setup_plan,
)
from guestagent.host.node.pressure import Headroom, HostMemory, headroom, host_short
from guestagent.host.node.sandboxes import DECLARED, Balloon, Sandbox, Vmm
from guestagent.host.streams import Watchdog
from guestagent.linux.cgroup.process_memory import CgroupMemoryUse
from guestagent.sizes import GIB, MIB
from guestagent.v1 import agent_pb2 as pb

POLICY = Host(
    headroom=256 * MIB, short_psi_some_avg10=10.0, short_available=0.1, cgroup_margin=128 * MIB
)
ROOMY = HostMemory(16 * GIB, 8 * GIB, 0.5)


@pytest.mark.parametrize(
    ("host", "cgroup", "room", "why"),
    [
        # The host has room, no cgroup limit: the headroom is kept.
        (ROOMY, None, 256 * MIB, "the host has room"),
        (ROOMY, CgroupMemoryUse("/pod", 3 * GIB, None), 256 * MIB, "the host has room"),
        # Stalling, or short of MemAvailable: every guest down to its figure.
        (HostMemory(16 * GIB, 8 * GIB, 12.0), None, 0, "host memory stall 12.0%"),
        (HostMemory(16 * GIB, GIB, None), None, 0, "host MemAvailable 1,024.0 MiB of"),
        # A VMM within the margin of its cgroup's memory.max: down to the figure, whatever the
        # host has; with room under the limit, the headroom.
        (ROOMY, CgroupMemoryUse("/pod", 1950 * MIB, 2 * GIB), 0, "cgroup /pod holds"),
        (ROOMY, CgroupMemoryUse("/pod", 1800 * MIB, 2 * GIB), 256 * MIB, "the host has room"),
        # A host without PSI is judged by MemAvailable alone.
        (HostMemory(16 * GIB, 8 * GIB, None), None, 256 * MIB, "the host has room"),
    ],
)
def test_headroom(host: HostMemory, cgroup: CgroupMemoryUse | None, room: int, why: str) -> None:
    decided = headroom(host, cgroup, POLICY)
    assert decided.bytes == room and why in decided.reason, decided


def test_a_host_exactly_at_the_bounds_is_short() -> None:
    assert host_short(HostMemory(10 * GIB, GIB - 1, 10.0), POLICY) is not None
    assert host_short(HostMemory(10 * GIB, GIB + MIB, 9.99), POLICY) is None


def sandbox(balloon: Balloon = Balloon.FOLLOW) -> Sandbox:
    return Sandbox("vm", DECLARED, "vsock://3:6464", None, Vmm("cloud-hypervisor", "/s"), balloon)


def info(revision: int, *absent: str) -> pb.AgentInfo:
    features = [
        pb.Feature(name=name, present=name not in absent, reason="off")
        for name in ("psi", "delayacct", "idle_ages")
    ]
    return pb.AgentInfo(version="0.1.0", contract_revision=revision, features=features)


@pytest.mark.parametrize(
    ("agent", "balloon", "reclaim", "follow", "missing"),
    [
        (info(4), Balloon.FOLLOW, True, True, []),
        # An agent before workload discovery: no reclaimer, said why.
        (info(3), Balloon.FOLLOW, False, True, ["(contract revision 3) cannot find its workloads"]),
        (None, Balloon.FOLLOW, False, True, ["before GetAgentInfo (contract revision 1)"]),
        # No stall signal at all: no reclaimer (the agent would refuse it).
        (info(4, "psi", "delayacct"), Balloon.NONE, False, False, ["no stall signal"]),
        # PSI off but delay accounting there: the reclaimer runs on it.
        (info(4, "psi"), Balloon.NONE, True, False, []),
        # No idle ages: the balloon follows a figure without cold memory.
        (info(4, "idle_ages"), Balloon.FOLLOW, True, True, ["cold memory in the safe figure"]),
        # The runtime drives the balloon, or the policy leaves it: not followed.
        (info(4), Balloon.RUNTIME, True, False, []),
        (info(4), Balloon.LEAVE, True, False, []),
    ],
)
def test_what_is_set_up_from_the_agents_info(
    agent: pb.AgentInfo | None, balloon: Balloon, reclaim: bool, follow: bool, missing: list[str]
) -> None:
    plan = setup_plan(agent, sandbox(balloon), NodePolicy())
    assert (plan.reclaim, plan.follow, plan.swap) == (reclaim, follow, True)
    assert len(plan.missing) == len(missing)
    for said, expected in zip(plan.missing, missing, strict=True):
        assert expected in said, plan.missing


def test_retries_double_to_a_cap() -> None:
    assert [retry_delay(n) for n in (1, 2, 3, 4, 5, 6, 7, 50)] == [1, 2, 4, 8, 16, 30, 30, 30]


class Knob:
    what = "balloon"

    def read(self, info: pb.MemoryInfo) -> Reading:
        return Reading(100 * MIB, 400 * MIB, False, 4096)

    def asked(self) -> int:
        return 100 * MIB

    def set(self, taken: int) -> None:
        raise AssertionError


def test_the_headroom_is_left_out_of_the_figure() -> None:
    room = [Headroom(256 * MIB, "")]
    knob = HeadroomKnob(Knob(), lambda: room[0])
    assert knob.read(pb.MemoryInfo()).safe == 144 * MIB
    room[0] = Headroom(0, "host short")
    assert knob.read(pb.MemoryInfo()).safe == 400 * MIB
    room[0] = Headroom(GIB, "")
    assert knob.read(pb.MemoryInfo()).safe == 0


@pytest.mark.parametrize(
    ("guest", "policy"),
    [
        (Guest(), pb.ReclaimPolicy(anon=False)),
        # The node's cold age reaches the reclaimer as it reaches the give-back figure.
        (
            Guest(reclaim_anon=True, cold_after_ms=30_000),
            pb.ReclaimPolicy(anon=True, cold_after_ms=30_000),
        ),
    ],
)
def test_the_reclaimers_policy_takes_the_nodes_cold_age(
    guest: Guest, policy: pb.ReclaimPolicy
) -> None:
    made = reclaim_policy(guest)
    assert made == policy
    assert made.HasField("cold_after_ms") == bool(guest.cold_after_ms)


class Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return f"{self._code.name} by the test"

    def trailing_metadata(self) -> tuple[()]:
        return ()


class SetUpAgent:
    """The two set-up calls, each failing with the code it is given (None: done)."""

    def __init__(self, swap: grpc.StatusCode | None, reclaim: grpc.StatusCode | None) -> None:
        self.fails = {"swap": swap, "reclaim": reclaim}
        self.asked: list[str] = []

    def _answer(self, step: str) -> None:
        self.asked.append(step)
        code = self.fails[step]
        if code is not None:
            raise Failed(code)

    def enable_swap(self, request: pb.EnableSwapRequest) -> pb.SwapArea:
        self._answer("swap")
        return pb.SwapArea(device=f"/dev/disk/by-id/virtio-{request.device.serial}")

    def set_workload_reclaim(self, on: bool, policy: pb.ReclaimPolicy) -> pb.ReclaimTargetStatus:
        self._answer("reclaim")
        return pb.ReclaimTargetStatus(reason="on")


@pytest.fixture
def loop() -> Iterator[GuestLoop]:
    watchdog, calls = Watchdog(), AsyncCalls()
    yield GuestLoop(
        sandbox(), NodePolicy(), lambda: HostMemory(8 * GIB, 4 * GIB, 0.0), watchdog, calls
    )
    watchdog.stop()
    calls.stop()


PLAN = SetupPlan(reclaim=True, swap=True, follow=False, missing=())


@pytest.mark.parametrize("code", sorted(TRANSIENT, key=str))
def test_a_set_up_step_cut_short_ends_the_round_to_be_tried_again(
    loop: GuestLoop, code: grpc.StatusCode
) -> None:
    """Under a loaded host EnableSwap can outlast its deadline: the round fails, and run()
    tries it again after its wait, rather than serving the VM without the step."""
    agent = SetUpAgent(swap=code, reclaim=None)
    with pytest.raises(grpc.RpcError):
        loop._set_up(agent, PLAN)  # type: ignore[arg-type]
    assert agent.asked == ["swap"]


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INVALID_ARGUMENT,
    ],
)
def test_a_refused_set_up_step_is_said_and_the_next_goes_on(
    loop: GuestLoop, code: grpc.StatusCode
) -> None:
    agent = SetUpAgent(swap=code, reclaim=None)
    loop._set_up(agent, PLAN)  # type: ignore[arg-type]
    assert agent.asked == ["swap", "reclaim"]
