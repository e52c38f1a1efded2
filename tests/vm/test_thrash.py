"""The agent answers through a whole-guest thrash (issue 56): two processes whose 640 MiB
working set is larger than the 512 MiB guest, in a cgroup with no memory.max, swap the whole
guest for a minute (tests/workloads/thrash.py). GetMemoryInfo's p99 from the host through it
stays within 3x its idle p99 in the same run, and a WatchMemory stream at 1 s never goes more
than 2 s without a message. The agent keeps its memory meanwhile (docs/design-transport.md,
the agent protects itself)."""

from __future__ import annotations

from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import module_guest
from tests.vm.pace import Pace
from tests.workloads.thrash import CONFIG, measure_thrash

pytestmark = pytest.mark.vm

RESULTS: dict[str, Any] = {}

vm = module_guest(CONFIG, RESULTS, "thrash")


def test_the_agent_answers_through_a_whole_guest_thrash(
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> None:
    figures = measure_thrash(vm, agent, pace.scale)
    RESULTS.update(figures)
    # It was a thrash: the guest swapped both ways, and nothing was killed.
    assert figures["guest"]["pswpin"] > 0 and figures["guest"]["pswpout"] > 0, figures
    assert figures["oom_kills"] == 0 and figures["same_agent"], figures
    targets = figures["targets"]
    assert targets["get_memory_info_p99_vs_idle"]["met"], figures
    assert targets["stream_gap_vs_interval"]["met"], figures
