"""`guestctl give-back` run from the host against a guest, shared by the VM test and the bench:
the command as an operator runs it, and the agent's cold figure it waits on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from guestagent.host.client import AgentClient
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM

MIB = 1 << 20
COLD_MIB, HOT_MIB = 400, 100
# Memory idle this long counts as cold: shorter than the agent's 60 s default, so a run
# waits less; the figure is the same kind either way.
COLD_AFTER_MS = 30_000
GUESTCTL = Path(sys.executable).with_name("guestctl")


def give_back(vm: GuestVM, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """guestctl give-back on the host, through the VM's second QMP monitor."""
    command = [str(GUESTCTL), "--target", vm.agent_target, "--timeout", "300", "--json"]
    command += ["give-back", "--qmp", str(vm.host_qmp_path), "--cold-after-ms", str(COLD_AFTER_MS)]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def done(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON a successful give-back printed; fails with its stderr otherwise."""
    assert run.returncode == 0, run.stderr
    result: dict[str, Any] = json.loads(run.stdout)
    return result


def cold_report(agent: AgentClient, cgroup: str) -> pb.MemoryInfo:
    """The report with the cold threshold give-back asks for, and the cgroup's figures."""
    request = pb.GetMemoryInfoRequest(cgroups=[cgroup], cold_after_ms=COLD_AFTER_MS)
    info: pb.MemoryInfo = agent.stub.GetMemoryInfo(request, timeout=agent.timeout)
    return info


def cold_bytes(agent: AgentClient, cgroup: str) -> tuple[int, int]:
    """(the guest's cold bytes, the cgroup's)."""
    info = cold_report(agent, cgroup)
    return info.giveback.cold.bytes, info.cgroups[0].giveback.cold.bytes


def full_size(vm: GuestVM) -> int:
    """The guest's RAM as QEMU counts it for the balloon: boot memory and what is plugged."""
    summary = vm.qmp("query-memory-size-summary")
    return int(summary["base-memory"] + summary.get("plugged-memory", 0))
