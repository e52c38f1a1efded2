"""SetMemoryLimits killed inside its memory.max write, in a real guest: after the init
restarts the agent, the cgroup holds the old set of limits or the new one, never a mix.

The kernel stores a lowered memory.max first and then reclaims down to it inside the write,
which takes seconds for a process holding 300 MiB; memory.low is written after it. A SIGKILL
then leaves memory.max and memory.swap.max new and memory.low old.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import boot_and_record, filler_ready, start_filler, stop_filler, wait_until

pytestmark = pytest.mark.vm

RESULTS: dict[str, object] = {}
CGROUP = "crash"
JOURNAL = "/run/guestagent/limits-journal.json"
FILES = ("memory.max", "memory.swap.max", "memory.low")
NEW_SPEC = pb.LinuxMemory(limit=32 * MIB, swap=1024 * MIB, reservation=16 * MIB)
OLD = {"memory.max": "max", "memory.swap.max": "max", "memory.low": "0"}
NEW = {"memory.max": str(32 * MIB), "memory.swap.max": str(992 * MIB), "memory.low": str(16 * MIB)}
# Run in the guest: wait until the journal exists and the kernel is still reclaiming inside
# the memory.max write (the new limit stored, usage above it), then SIGKILL the agent.
KILL_INSIDE_THE_WRITE = f"""
cd /sys/fs/cgroup/{CGROUP}
end=$(($(date +%s) + 240))
until [ -e {JOURNAL} ] && [ "$(cat memory.max)" = {NEW["memory.max"]} ] \\
        && [ "$(cat memory.current)" -gt {NEW["memory.max"]} ]; do
    [ "$(date +%s)" -lt "$end" ] || {{ echo "the write was never caught in progress" >&2; exit 1; }}
done
values="$(cat {" ".join(FILES)} | tr '\\n' ' ')"
current=$(cat memory.current)
kill -KILL $(pgrep -x guestagent)
echo "$values"
echo "$current"
"""


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    config = VMConfig(memory_mib=512, disks=(Disk("swap", 1 << 30, serial="swap0"),))
    yield from boot_and_record(config, image, tmp_path_factory, RESULTS, "crash")


def limit_values(vm: GuestVM) -> dict[str, str]:
    text = vm.exec(["cat", *(f"/sys/fs/cgroup/{CGROUP}/{f}" for f in FILES)]).stdout
    return dict(zip(FILES, text.split(), strict=True))


def agent_pid(vm: GuestVM) -> str:
    return vm.exec(["pgrep", "-x", "guestagent"], check=False).stdout.strip()


def test_a_kill_inside_memory_max_is_rolled_back_at_restart(
    vm: GuestVM, agent: AgentClient
) -> None:
    agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
    agent.set_limits(CGROUP, pb.LinuxMemory(limit=-1), create=True)
    marker = start_filler(vm, CGROUP, 300, name="crash")
    wait_until(lambda: filler_ready(vm, marker), 600, "the filler to hold 300 MiB")
    before = limit_values(vm)
    assert before == OLD
    killed_pid = agent_pid(vm)
    outcome: dict[str, object] = {}

    def set_limits() -> None:
        try:
            outcome["applied"] = agent.set_limits(CGROUP, NEW_SPEC)
        except grpc.RpcError as e:
            outcome["error"] = e.code()

    caller = threading.Thread(target=set_limits)
    caller.start()
    killer = vm.exec(["sh", "-c", KILL_INSIDE_THE_WRITE], timeout=300)
    caller.join(timeout=120)
    at_kill_text, current_text = killer.stdout.splitlines()
    at_kill = dict(zip(FILES, at_kill_text.split(), strict=True))

    wait_until(lambda: agent_pid(vm) not in ("", killed_pid), 120, "init to restart the agent")
    agent.wait_ready(120)
    after = limit_values(vm)
    log = [
        json.loads(line)
        for line in vm.exec(["cat", "/var/log/guestagent.log"]).stdout.splitlines()
        if '"limits_rolled_back"' in line
    ]
    RESULTS.update(
        before=before,
        at_kill=at_kill,
        memory_current_mib_at_kill=round(int(current_text) / MIB),
        after=after,
        rolled_back_log=log,
        caller=str(outcome),
    )

    assert "error" in outcome, outcome  # The caller never got an answer...
    assert at_kill not in (OLD, NEW), at_kill  # ...because the kill left the files mixed...
    assert after in (OLD, NEW), after  # ...which the restarted agent put right.
    assert after == OLD  # Rolled back, not completed: the caller retries what it last sent.
    assert vm.exec(["test", "-e", JOURNAL], check=False).rc != 0
    assert len(log) == 1 and log[0]["cgroup"] == CGROUP
    stop_filler(vm, "crash")
