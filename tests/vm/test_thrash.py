"""The agent answers through a whole-guest thrash (issue 56): two processes whose 640 MiB
working set is larger than the 512 MiB guest, in a cgroup with no memory.max, swap the whole
guest for a minute (tests/workloads/thrash.py). The agent keeps its memory meanwhile
(docs/design-transport.md, the agent protects itself): unlocked it took 1951 and 3071 major
faults in the minute and ended with 7-9 MiB in swap. A WatchMemory stream at 1 s never goes
more than 2 s (paced) without a message.

GetMemoryInfo's p99 through the thrash against its idle p99 (issue 56's target: 3x) is kept
with its verdict in the results and the bench's thrash section, not asserted: with the same
code it measured 1.65x to 17x from run to run on the shared development host, following the
idle p99's own noise (36-340 ms; docs/measurements.md, whole-guest thrash).
"""

from __future__ import annotations

from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import module_guest
from tests.vm.pace import Pace
from tests.workloads.thrash import CONFIG, GAP_VS_INTERVAL, STREAM_INTERVAL_MS, measure_thrash

pytestmark = pytest.mark.vm

RESULTS: dict[str, Any] = {}
# The agent's major faults in the thrash's minute, locked: 0-2 in every run.
AGENT_MAJOR_FAULTS = 20

vm = module_guest(CONFIG, RESULTS, "thrash")


def test_the_agent_answers_through_a_whole_guest_thrash(
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> None:
    figures = measure_thrash(vm, agent, pace.scale)
    RESULTS.update(figures)
    # It was a thrash: the guest swapped both ways, and nothing was killed.
    assert figures["guest"]["pswpin"] > 0 and figures["guest"]["pswpout"] > 0, figures
    assert figures["oom_kills"] == 0 and figures["same_agent"], figures
    # Its pages stayed in.
    assert figures["agent_major_faults_in_thrash"] <= AGENT_MAJOR_FAULTS, figures
    assert figures["agent_swapped_mib_after"] == 0 and figures["agent_locked_mib_after"] > 0, (
        figures
    )
    # Its stream kept its interval.
    bound = pace.scale(GAP_VS_INTERVAL * STREAM_INTERVAL_MS / 1000)
    assert figures["stream_gap_max_s"] <= bound, figures
