"""The second kernel configuration: the same image booted with `psi=0` and the multi-gen LRU
left off (`guestagent.mglru=0`), as Kata's guest kernel boots without `psi=1` and Apple's,
which has neither. The tests that touch PSI or the multi-gen LRU run here, plus one smoke of
everything else (docs/kernel-features.md)."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from guestagent.host.client import AgentClient, WatchStream
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import Disk, GuestVM, VMConfig
from tests.vm.guest import (
    boot,
    filler_ready,
    make_cgroup,
    plug_dimm_and_wait_online,
    start_filler,
    stop_filler,
    wait_until,
)
from tests.vm.pace import Pace

pytestmark = pytest.mark.vm

MIB = 1 << 20
NO_PSI = "psi=0 guestagent.mglru=0"
RESULTS: dict[str, Any] = {"kernel_cmdline_added": NO_PSI}


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    config = VMConfig(
        memory_mib=768,
        slots=2,
        maxmem_mib=2048,
        disks=(Disk("swap", 1 << 30, serial="swap0"),),
        extra_cmdline=NO_PSI,
    )
    started = time.monotonic()
    for guest in boot(config, image, tmp_path_factory):
        RESULTS["boot_to_serving_seconds"] = round(guest.boot_seconds or 0, 1)
        yield guest
    RESULTS["module_seconds"] = round(time.monotonic() - started, 1)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "no_psi.json").write_text(json.dumps(RESULTS, indent=2) + "\n")


def absent(message: pb.MemoryInfo | pb.ReclaimTargetStatus) -> dict[str, str]:
    return {a.feature: a.reason for a in message.absent}


def test_the_report_says_psi_and_the_multigen_lru_are_absent(
    vm: GuestVM, agent: AgentClient
) -> None:
    assert vm.exec(["test", "-e", "/proc/pressure/memory"], check=False).rc != 0
    assert vm.exec(["cat", "/sys/kernel/mm/lru_gen/enabled"]).stdout.strip() == "0x0000"
    make_cgroup(vm, "plain")
    info = agent.info(["plain"])
    reasons = absent(info)
    assert "booted with psi=0" in reasons["psi"], reasons
    assert "multi-gen LRU is off" in reasons["mglru"], reasons
    # Unset, never a zero stall.
    assert not info.HasField("pressure") and not info.cgroups[0].HasField("pressure")


def collect(stream: WatchStream, into: queue.Queue[pb.MemoryInfo]) -> None:
    try:
        for message in stream:
            into.put(message)
    except grpc.RpcError:  # Cancelled when the test ends.
        return


def test_watch_runs_on_memory_events_and_its_interval_without_psi(
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> None:
    make_cgroup(vm, "watched", memory_high="24M")
    stream = agent.watch(["watched"], interval_ms=1000)
    messages: queue.Queue[pb.MemoryInfo] = queue.Queue()
    threading.Thread(target=collect, args=(stream, messages), daemon=True).start()
    try:
        assert messages.get(timeout=pace.scale(60)).reason == pb.WATCH_REASON_INITIAL
        start_filler(vm, "watched", 64, name="highfill")
        reasons: set[int] = set()
        while not {pb.WATCH_REASON_MEMORY_EVENTS, pb.WATCH_REASON_INTERVAL} <= reasons:
            message = messages.get(timeout=pace.scale(60))
            reasons.add(message.reason)
        assert pb.WATCH_REASON_PRESSURE not in reasons
    finally:
        stream.cancel()
        stop_filler(vm, "highfill")


def test_an_explicit_pressure_trigger_is_refused_saying_why(agent: AgentClient) -> None:
    stream = agent.watch([], trigger=pb.PressureTrigger(stall_us=50_000, window_us=500_000))
    with pytest.raises(grpc.RpcError) as raised:
        next(iter(stream))
    error: Any = raised.value
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no PSI" in error.details() and "psi=0" in error.details()


def test_the_reclaimer_refuses_naming_psi_and_psi_1(agent: AgentClient, vm: GuestVM) -> None:
    make_cgroup(vm, "cold")
    with pytest.raises(grpc.RpcError) as raised:
        agent.set_reclaim_policy("cold", True)
    error: Any = raised.value
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "needs PSI" in error.details() and "psi=1" in error.details()
    assert list(agent.reclaim_status().targets) == []


def test_swap_limits_reclaim_compaction_and_hotplug_still_work(
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> None:
    """One smoke of everything that reads neither PSI nor the multi-gen LRU."""
    agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
    assert [a.device for a in agent.list_swaps()]
    applied = agent.set_limits(
        "pod/ctr", pb.LinuxMemory(limit=64 * MIB, swap=192 * MIB), create=True
    )
    assert applied.memory_max == str(64 * MIB) and applied.swap_max == str(128 * MIB)
    marker = start_filler(vm, "pod/ctr", 128, name="swapper")
    try:
        wait_until(lambda: filler_ready(vm, marker), pace.scale(300), "128 MiB over a 64 MiB limit")
        (ctr,) = agent.info(["pod/ctr"]).cgroups
        assert ctr.swap_current_bytes > 32 * MIB and ctr.events.oom_kill == 0
        result = agent.reclaim("pod/ctr", 16 * MIB)
        assert result.current_before_bytes - result.current_after_bytes > 8 * MIB
    finally:
        stop_filler(vm, "swapper")
    compacted = agent.compact()
    assert len(compacted.free_blocks_after) > 0
    before, grown = plug_dimm_and_wait_online(vm, agent, 128)
    RESULTS["smoke"] = {
        "swap_current_mib": round(ctr.swap_current_bytes / MIB, 1),
        "reclaimed_mib": round((result.current_before_bytes - result.current_after_bytes) / MIB),
        "compaction_us": compacted.duration_us,
        "hotplug_mem_total_mib": [before // MIB, grown // MIB],
    }
