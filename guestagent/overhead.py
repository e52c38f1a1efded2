"""What the guest costs before any workload runs: figures for sizing VMs truthfully.

Not all of a VM's memory is usable: the kernel keeps a share (present - MemTotal) that
grows with VM size, and daemons (this agent among them) use memory outside the workload
cgroups. Runtimes guess these; the agent measures them.
"""

from __future__ import annotations

from dataclasses import dataclass

from guestagent.hotplug import block_size_bytes, memory_blocks
from guestagent.kernelfs import KernelFS, read_text
from guestagent.meminfo import read_cgroup_memory, read_system_memory


@dataclass(frozen=True)
class GuestOverhead:
    present: int
    mem_total: int
    kernel_reserved: int
    outside_workloads: int
    agent_rss: int
    workloads: int


def rss_bytes(status_text: str) -> int:
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def guest_overhead(fs: KernelFS, workload_cgroups: tuple[str, ...] = ()) -> GuestOverhead:
    workloads = sum(read_cgroup_memory(fs, name).current for name in workload_cgroups)
    online = sum(1 for state in memory_blocks(fs).values() if state == "online")
    present = online * block_size_bytes(fs)
    system = read_system_memory(fs)
    used = system.mem_total - system.mem_available
    return GuestOverhead(
        present=present,
        mem_total=system.mem_total,
        kernel_reserved=max(0, present - system.mem_total),
        outside_workloads=max(0, used - workloads),
        agent_rss=rss_bytes(read_text(fs.proc("self", "status"))),
        workloads=workloads,
    )
