"""What the guest costs before any workload runs: figures for sizing VMs truthfully.

Not all of a VM's memory is usable: the kernel keeps a share (present - MemTotal) that
grows with VM size, and daemons (this agent among them) use memory outside the workload
cgroups. Runtimes guess these; the agent measures them. Within the kernel's share it names
the swiotlb, which a confidential guest sizes with its memory, so an operator can check
`guestctl plan --platform`'s model against a real guest.
"""

from __future__ import annotations

from guestagent.linux.abi import PAGE_SIZE
from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.features import Absent
from guestagent.linux.kernel import Kernel
from guestagent.linux.memblocks import block_size_bytes, memory_blocks
from guestagent.linux.meminfo import read_system_memory
from guestagent.linux.mm import read_own_rss, read_present_bytes
from guestagent.linux.swiotlb import Swiotlb, read_swiotlb
from guestagent.records import record


@record
class GuestOverhead:
    present: int
    mem_total: int
    kernel_reserved: int
    outside_workloads: int
    agent_rss: int
    workloads: int
    swiotlb: Swiotlb | Absent  # within kernel_reserved


def guest_overhead(kernel: Kernel, workload_cgroups: tuple[CgroupName, ...] = ()) -> GuestOverhead:
    workloads = sum(kernel.cgroup(name).current() for name in workload_cgroups)
    present = read_present_bytes(kernel, PAGE_SIZE)
    if present is None:
        online = sum(1 for state in memory_blocks(kernel).values() if state == "online")
        present = online * block_size_bytes(kernel)
    system = read_system_memory(kernel)
    used = system.mem_total - system.mem_available
    return GuestOverhead(
        present=present,
        mem_total=system.mem_total,
        kernel_reserved=max(0, present - system.mem_total),
        outside_workloads=max(0, used - workloads),
        agent_rss=read_own_rss(kernel),
        workloads=workloads,
        swiotlb=read_swiotlb(kernel),
    )
