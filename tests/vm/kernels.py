"""The runtimes' guest kernels, as this image boots them, and what every one of them must show.

Kata's and Firecracker's guest kernels build PSI with CONFIG_PSI_DEFAULT_DISABLED and the
multi-gen LRU off at boot; Apple's containerization builds neither (docs/kernel-features.md).
The test image boots `psi=0` and `guestagent.mglru=0` (the init leaves lru_gen off) to stand
for them: on "kata-fc" the agent turns the multi-gen LRU on as it starts, on "apple" it runs
with --mglru keep, so the classic LRU, as on a kernel without one. Both have delay accounting,
which the agent turns on: the reclaimer's stall signal there.

The scenarios every runtime kernel must pass (RuntimeKernelScenarios) run on one boot, the
"apple" one: delay accounting is read by the same code on both, and the multi-gen LRU's reclaim
is the PSI boot's (tests/vm/test_reclaimer.py), so the classic LRU is the part no other test
runs, and the harder one (probing a hot set costs the workload more there:
docs/kernel-features.md). make bench's reclaimer section still runs them on every
configuration.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import Any, ClassVar

import grpc

from guestagent.host.client import AgentClient, WatchStream
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import make_cgroup
from tests.vm.pace import Pace
from tests.workloads.reclaim import (
    KERNELS,
    SETTLE_S,
    WITHIN_S,
    assert_no_thrash_bounds,
    assert_off_then_on_bounds,
    fill_data_disk,
    no_thrash,
    off_then_on,
    without_timelines,
)

KATA_FC = KERNELS["kata-fc"]
APPLE = KERNELS["apple"]
DELAYACCT_STALL = "delayacct_stall"


def absent(message: pb.MemoryInfo | pb.ReclaimTargetStatus) -> dict[str, str]:
    return {a.feature: a.reason for a in message.absent}


def audit_lines(vm: GuestVM, setting: str) -> list[dict[str, Any]]:
    """The agent's audit lines for a kernel setting it changed at start."""
    lines = []
    for line in vm.exec(["cat", "/var/log/guestagent.log"]).stdout.splitlines():
        if '"audit"' in line and setting in line:
            lines.append(json.loads(line))
    return lines


def check_off_then_on(vm: GuestVM, agent: AgentClient, results: dict[str, Any], pace: Pace) -> None:
    """The PSI run's bounds, on delay accounting (tests/workloads/reclaim.py says why each);
    the figures go into results first, so a failed run's are kept too."""
    window = pace.scale(WITHIN_S)
    # The classic LRU has no ages to evict by: the window ends at 80 %, as it did before them.
    figures = results["off_then_on"] = off_then_on(vm, agent, DELAYACCT_STALL, window, 0.8)
    assert figures["signals"][0] == DELAYACCT_STALL, without_timelines(figures)
    assert_off_then_on_bounds(figures, pace.factor)


def check_no_thrash(vm: GuestVM, agent: AgentClient, results: dict[str, Any], pace: Pace) -> None:
    figures = results["no_thrash"] = no_thrash(
        vm, agent, source=DELAYACCT_STALL, settle_within_s=pace.scale(SETTLE_S)
    )
    assert figures["signals"][0] == DELAYACCT_STALL, without_timelines(figures)
    assert_no_thrash_bounds(figures, pace.factor)


def _collect(stream: WatchStream, into: queue.Queue[pb.MemoryInfo]) -> None:
    try:
        for message in stream:
            into.put(message)
    except grpc.RpcError:  # Cancelled when the check ends.
        return


def check_trigger_fires_under_pressure(
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> dict[str, Any]:
    """An explicit pressure trigger, served by delay accounting: a reader of the data disk in a
    cgroup held to 16 MiB stalls in reclaim, and the stream says PRESSURE (its interval is a
    minute off, so nothing else wakes it in between)."""
    device = fill_data_disk(vm, 64)
    make_cgroup(vm, "squeezed", memory_max="16M")
    trigger = pb.PressureTrigger(stall_us=50_000, window_us=1_000_000)
    stream = agent.watch(["squeezed"], interval_ms=60_000, trigger=trigger)
    messages: queue.Queue[pb.MemoryInfo] = queue.Queue()
    threading.Thread(target=_collect, args=(stream, messages), daemon=True).start()
    try:
        first = messages.get(timeout=pace.scale(60))
        assert first.reason == pb.WATCH_REASON_INITIAL
        assert not first.HasField("pressure") and first.HasField("delay_stall"), first
        assert first.cgroups[0].delay_stall.source == DELAYACCT_STALL
        vm.exec(
            "sh -c 'echo $$ > /sys/fs/cgroup/squeezed/cgroup.procs; echo $$ > /run/reader.pid; "
            f'exec sh -c "while :; do cat {device} > /dev/null; done"\' '
            "</dev/null >/dev/null 2>&1 &"
        )

        deadline = time.monotonic() + pace.scale(120)
        while True:
            try:
                fired = messages.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("no PRESSURE message within the deadline") from None
            if fired.reason == pb.WATCH_REASON_PRESSURE:
                break
    finally:
        stream.cancel()
        pid = vm.exec(["cat", "/run/reader.pid"], check=False).stdout.strip()
        if pid:
            vm.exec(["kill", pid], check=False)
    stalled = fired.cgroups[0].delay_stall.total_us - first.cgroups[0].delay_stall.total_us
    assert stalled > 0, fired
    return {
        "trigger": {"stall_us": 50_000, "window_us": 1_000_000},
        "cgroup_delay_stall_ms_until_fired": round(stalled / 1000, 1),
        "guest_delay_stall_ms_until_fired": round(
            (fired.delay_stall.total_us - first.delay_stall.total_us) / 1000, 1
        ),
    }


class RuntimeKernelScenarios:
    """The reclaimer's two scenarios on delay accounting and an explicit pressure trigger: a
    runtime kernel's test module subclasses this with its RESULTS, and its own `vm` fixture
    boots its kernel's guest (test_apple.py; the module docstring says why only it)."""

    results: ClassVar[dict[str, Any]]

    def test_cold_memory_goes_back_on_delay_accounting(
        self, vm: GuestVM, agent: AgentClient, pace: Pace
    ) -> None:
        check_off_then_on(vm, agent, self.results, pace)

    def test_no_thrash_on_delay_accounting(
        self, vm: GuestVM, agent: AgentClient, pace: Pace
    ) -> None:
        check_no_thrash(vm, agent, self.results, pace)

    def test_an_explicit_pressure_trigger_fires_under_pressure(
        self, vm: GuestVM, agent: AgentClient, pace: Pace
    ) -> None:
        self.results["trigger"] = check_trigger_fires_under_pressure(vm, agent, pace)
