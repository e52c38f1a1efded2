"""GetMemoryInfo and WatchMemory with idle ages: the figures from the one aging loop, absent
(with why) when there are none, and bad bin edges refused naming them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from guestagent.agent.rpc import MemoryAgentServicer
from guestagent.linux.lru_gen import lru_gen_path
from guestagent.ops.idle import IdleAger
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.root import FakeRoot
from tests.fakes.servicer import Aborted, FakeContext, make_servicer, memory_info

S = 1_000_000_000
PAGES_100_MIB = 100 * 256
# The pod's pages: 100 MiB of anon in the oldest generation, idle as long as the next is old.
LRU_GEN = f"""\
memcg 1 /
 node 0
 1 100000 0 10
 2 0 0 0
memcg 5 /pod
 node 0
 3 200000 {PAGES_100_MIB} 256
 4 90000 0 0
 5 10000 256 0
 6 0 0 0
"""


@pytest.fixture
def aged(fake_root: FakeRoot) -> MemoryAgentServicer:
    fake_root.add_cgroup("pod")
    return aged_servicer(fake_root)


def aged_servicer(fake_root: FakeRoot) -> MemoryAgentServicer:
    # The LRU now holds what the books do: none of it has left since the aging.
    fake_root.write(
        "sys/fs/cgroup/pod/memory.stat",
        f"anon {101 << 20}\nfile {1 << 20}\nactive_anon {101 << 20}\ninactive_anon 0\n"
        f"active_file {1 << 20}\ninactive_file 0\n",
    )
    fake_root.write("sys/kernel/mm/lru_gen/enabled", "0x0007\n")
    fake_root.write("sys/kernel/debug/lru_gen", LRU_GEN)
    aging: list[str] = []

    def kernel(path: Path, value: str, proceed: Any) -> None:
        if path == Path(lru_gen_path(fake_root.fs)):
            aging.append(value)  # The fake kernel does not age: the reading stays as written.
        else:
            proceed(value)

    fake_root.kernel.on("write", kernel)
    # Monotonic 1000 s, the wall clock a day later: reports say the wall clock's time.
    ager = IdleAger(fake_root.fs, clock=lambda: 1000 * S, wall=lambda: (86_400 + 1000) * S)
    ager.cycle()
    assert aging == ["+ 1 0 2 1 1;+ 5 0 6 1 1"]
    return make_servicer(fake_root, ager)


async def test_report_carries_the_idle_histogram_and_cold(aged: MemoryAgentServicer) -> None:
    context: Any = FakeContext()
    info = await memory_info(aged, pb.GetMemoryInfoRequest(cgroups=["pod"]), context)
    (pod,) = info.cgroups
    assert pod.idle.source == "mglru" and pod.idle.aged_at_unix_ns == (86_400 + 1000) * S
    assert [b.idle_at_least_ms for b in pod.idle.bins] == [0, 1000, 10000, 60000, 300000]
    # Generation 3 is as idle as 4 is old (90 s), 5 as idle as 6 (0 s).
    assert pod.idle.bins[3].anon_bytes == 100 << 20 and pod.idle.bins[0].anon_bytes == 1 << 20
    assert pod.giveback.cold.bytes == (100 << 20) + (1 << 20)  # Swap has room.
    assert pod.giveback.cold_after_ms == 60000
    assert not pod.giveback.HasField("safe_balloon_target")
    whole = info.idle
    assert sum(b.file_bytes for b in whole.bins) == (10 + 256) * 4096
    assert info.giveback.HasField("safe_balloon_target")
    assert info.giveback.HasField("free_reportable")
    assert "mglru" not in {a.feature for a in info.absent}


async def test_edges_and_threshold_are_the_callers(aged: MemoryAgentServicer) -> None:
    context: Any = FakeContext()
    request = pb.GetMemoryInfoRequest(cgroups=["pod"], idle_edges_ms=[95000], cold_after_ms=100000)
    (pod,) = (await memory_info(aged, request, context)).cgroups
    assert [(b.idle_at_least_ms, b.anon_bytes) for b in pod.idle.bins] == [
        (0, (100 << 20) + (1 << 20)),
        (95000, 0),
    ]
    assert pod.giveback.cold.bytes == 0 and pod.giveback.cold_after_ms == 100000


@pytest.mark.parametrize(
    ("edges", "details"),
    [
        ([10, 5], "idle_edges_ms [10, 5] are not strictly ascending"),
        ([0], "idle_edges_ms [0]: an edge of 0 ms"),
        (list(range(1, 17)), "idle_edges_ms has 16 edges: at most 15"),
    ],
)
async def test_bad_edges_are_invalid_argument(
    aged: MemoryAgentServicer, edges: list[int], details: str
) -> None:
    context: Any = FakeContext()
    with pytest.raises(Aborted):
        await memory_info(aged, pb.GetMemoryInfoRequest(idle_edges_ms=edges), context)
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    assert details in context.details


async def test_without_the_multigen_lru_the_figures_are_absent_not_zero(
    fake_root: FakeRoot,
) -> None:
    fake_root.add_cgroup("pod")
    ager = IdleAger(fake_root.fs)
    ager.cycle()
    context: Any = FakeContext()
    info = await memory_info(
        make_servicer(fake_root, ager), pb.GetMemoryInfoRequest(cgroups=["pod"]), context
    )
    assert not info.HasField("idle") and not info.cgroups[0].HasField("idle")
    assert not info.giveback.HasField("cold") and not info.cgroups[0].giveback.HasField("cold")
    (mglru,) = [a for a in info.absent if a.feature == "mglru"]
    assert "multi-gen LRU" in mglru.reason
    # The balloon target stays, counting every LRU page as in use.
    assert "no idle ages" in info.giveback.safe_balloon_target.reason


async def test_a_watch_carries_what_get_memory_info_carries(aged: MemoryAgentServicer) -> None:
    """One report path: a stream's message is GetMemoryInfo's answer for the same request,
    the idle figures and the confidential section included, plus why it was sent."""
    context: Any = FakeContext()
    stream: Any = aged.WatchMemory(
        pb.WatchMemoryRequest(cgroups=["pod"], idle_edges_ms=[60000]), context
    )
    first = await anext(stream)
    await stream.aclose()
    assert [b.idle_at_least_ms for b in first.cgroups[0].idle.bins] == [0, 60000]
    assert first.cgroups[0].giveback.cold.bytes > 0
    unary = await memory_info(
        aged, pb.GetMemoryInfoRequest(cgroups=["pod"], idle_edges_ms=[60000]), context
    )
    assert first.confidential.platform == unary.confidential.platform == "none"
    assert first.reason == pb.WATCH_REASON_INITIAL
    for message in (first, unary):  # What differs between two reads of the same guest.
        message.ClearField("reason")
        message.ClearField("collected_at_unix_ns")
        message.ClearField("vmstat")
    assert first.ListFields() and [f.name for f, _ in first.ListFields()] == [
        f.name for f, _ in unary.ListFields()
    ]


def test_a_wall_clock_step_ages_nothing(fake_root: FakeRoot) -> None:
    """The books keep the monotonic clock: the wall clock stepping an hour between two agings
    (an NTP step after a snapshot's restore) leaves the young pages young; on the wall clock
    the 256 pages 10 s old at the first aging came out an hour idle, and cold."""
    fake_root.add_cgroup("pod")
    fake_root.write("sys/kernel/mm/lru_gen/enabled", "0x0007\n")
    fake_root.write("sys/kernel/debug/lru_gen", "memcg 5 /pod\n node 0\n 5 10000 256 0\n 6 0 0 0\n")
    fake_root.kernel.on("write", lambda path, value, proceed: None)  # No aging in the fake.
    clocks = iter([(1000 * S, 5000 * S), (1010 * S, 5010 * S + 3600 * S)])
    now = next(clocks)
    ager = IdleAger(fake_root.fs, clock=lambda: now[0], wall=lambda: now[1])
    ager.cycle()
    # 10 s on, one aging later: generation 5's pages were not used since the first aging.
    fake_root.write("sys/kernel/debug/lru_gen", "memcg 5 /pod\n node 0\n 6 10000 256 0\n 7 0 0 0\n")
    now = next(clocks)
    ager.cycle()
    view = ager.state.view("pod")
    assert view is not None and view.idle_at_least(60_000) == (0, 0)
    assert view.idle_at_least(10_000) == (256 * 4096, 0)
    assert view.aged_ns == 5010 * S + 3600 * S  # Unix time, from the wall clock.


async def test_cold_anon_of_a_cgroup_that_may_not_swap_is_left_out(fake_root: FakeRoot) -> None:
    """The pod's 100 MiB of cold anon cannot go with memory.swap.max 0 (kubelet's NoSwap):
    neither its figure nor the guest's counts it, though the guest's swap has room."""
    fake_root.add_cgroup("pod")
    fake_root.write("sys/fs/cgroup/pod/memory.swap.max", "0\n")
    servicer = aged_servicer(fake_root)
    context: Any = FakeContext()
    info = await memory_info(servicer, pb.GetMemoryInfoRequest(cgroups=["pod"]), context)
    (pod,) = info.cgroups
    assert pod.giveback.cold.bytes == 1 << 20  # Its cold file only.
    assert "100.0 MiB cold anon left out: its cgroups may not swap" in pod.giveback.cold.reason
    assert info.giveback.cold.bytes < 100 << 20
    assert "may not swap" in info.giveback.cold.reason
