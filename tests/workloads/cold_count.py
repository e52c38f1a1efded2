"""When the scenarios take the agent's cold count as a workload's whole cold set: the agent's
cold figure at the scenarios' threshold, counted in two aging rounds in a row."""

from __future__ import annotations

from dataclasses import dataclass

from guestagent.host.client import AgentClient
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from tests.vm.guest import wait_until

# Memory idle this long counts as cold in the scenarios: shorter than the agent's 60 s
# default, so a run waits less; the figure is the same kind either way.
COLD_AFTER_MS = 30_000


def cold_report(agent: AgentClient, cgroup: str) -> pb.MemoryInfo:
    """The report at the scenarios' cold threshold, with the cgroup's figures."""
    request = pb.GetMemoryInfoRequest(cgroups=[cgroup], cold_after_ms=COLD_AFTER_MS)
    info: pb.MemoryInfo = agent.stub.GetMemoryInfo(request, timeout=agent.timeout)
    return info


# The agent counts the set cold in steps, one an aging round (10 s by default): under a slow
# guest the set's fill spans two rounds, and a give-back read at the first step took 0.764 of
# the set (CI, 2026-12-06). So the count must also have held from one round to the next.
COUNTED_FRACTION = 0.85
HELD_WITHIN_FRACTION = 0.02


@dataclass(frozen=True)
class ColdReading:
    """One read of the agent's cold figures: the cgroup's aging round and cold bytes, and the
    guest's cold bytes."""

    aged_at_unix_ns: int
    cgroup_bytes: int
    guest_bytes: int


def count_held(earlier: ColdReading, later: ColdReading, set_bytes: int) -> bool:
    """Whether the two readings come from different aging rounds, both count
    COUNTED_FRACTION of a set of set_bytes cold, and the later grew by at most
    HELD_WITHIN_FRACTION of it: the whole set is counted, not one round's part of it."""
    counted = COUNTED_FRACTION * set_bytes
    return (
        later.aged_at_unix_ns > earlier.aged_at_unix_ns
        and min(earlier.cgroup_bytes, later.cgroup_bytes) >= counted
        and later.cgroup_bytes - earlier.cgroup_bytes <= HELD_WITHIN_FRACTION * set_bytes
    )


def counted_cold(
    agent: AgentClient, cgroup: str, timeout: float, set_bytes: int
) -> tuple[int, int]:
    """(the guest's cold bytes, the cgroup's) once the agent counts the cgroup's set of
    set_bytes cold in two aging rounds in a row (count_held); fails past timeout."""
    previous_round: ColdReading | None = None
    last: ColdReading | None = None

    def held() -> tuple[int, int] | None:
        nonlocal previous_round, last
        info = cold_report(agent, cgroup)
        reading = ColdReading(
            info.cgroups[0].idle.aged_at_unix_ns,
            info.cgroups[0].giveback.cold.bytes,
            info.giveback.cold.bytes,
        )
        if last is not None and last.aged_at_unix_ns < reading.aged_at_unix_ns:
            previous_round = last
        last = reading
        if previous_round is not None and count_held(previous_round, reading, set_bytes):
            return reading.guest_bytes, reading.cgroup_bytes
        return None

    what = f"the agent to count the {set_bytes / MIB:g} MiB set cold"
    return wait_until(held, timeout, what, every=2.0)
