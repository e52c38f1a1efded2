"""What the guest costs before any workload runs: figures for sizing VMs truthfully.

Not all of a VM's memory is usable: the kernel keeps a share (present - MemTotal) that
grows with VM size, and daemons (this agent among them) use memory outside the workload
cgroups. Runtimes guess these; the agent measures them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from guestagent.errors import KernelFormat
from guestagent.linux.cgroups import cgroup_dir
from guestagent.linux.fs import KernelFS
from guestagent.linux.memblocks import block_size_bytes, memory_blocks
from guestagent.linux.meminfo import read_current, read_system_memory


@dataclass(frozen=True)
class GuestOverhead:
    present: int
    mem_total: int
    kernel_reserved: int
    outside_workloads: int
    agent_rss: int
    workloads: int


def parse_zoneinfo_present(text: str) -> int:
    """Pages present in all zones: the RAM the kernel manages, online hot-plugged memory
    included. Counting whole memory blocks instead would round a 306 MiB guest up to 384."""
    try:
        return sum(
            int(fields[1])
            for fields in (line.split() for line in text.splitlines())
            if len(fields) == 2 and fields[0] == "present"
        )
    except ValueError:
        raise KernelFormat("zoneinfo has a 'present' line that is not a page count") from None


def rss_bytes(status_text: str) -> int:
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            try:
                return int(line.split()[1]) * 1024
            except (IndexError, ValueError):
                raise KernelFormat(f"status line {line!r} is malformed") from None
    return 0


def guest_overhead(fs: KernelFS, workload_cgroups: tuple[str, ...] = ()) -> GuestOverhead:
    workloads = sum(read_current(fs, cgroup_dir(fs, name), name) for name in workload_cgroups)
    zoneinfo = fs.read_optional(fs.proc("zoneinfo"))
    if zoneinfo is not None:
        present = parse_zoneinfo_present(zoneinfo) * os.sysconf("SC_PAGE_SIZE")
    else:
        online = sum(1 for state in memory_blocks(fs).values() if state == "online")
        present = online * block_size_bytes(fs)
    system = read_system_memory(fs)
    used = system.mem_total - system.mem_available
    return GuestOverhead(
        present=present,
        mem_total=system.mem_total,
        kernel_reserved=max(0, present - system.mem_total),
        outside_workloads=max(0, used - workloads),
        agent_rss=rss_bytes(fs.read(fs.proc("self", "status"))),
        workloads=workloads,
    )
