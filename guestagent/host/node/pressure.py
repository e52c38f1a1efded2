"""The host's own memory, weighed: whether the host is short (PSI, MemAvailable), and each
VM's headroom from it and from its VMM's host cgroup. While the host is short, or a VMM nears
its cgroup's memory.max (a pod's limit: a Cloud Hypervisor worker pod whose guest RAM is
charged to it is OOM-killed by the host once the guest faults enough in), every guest is taken
down to its safe figure; otherwise each keeps a headroom above it, so a growing guest does not
wait for a deflate. Pure, but for `read_host`."""

from __future__ import annotations

from dataclasses import dataclass

from guestagent.host.display import mib
from guestagent.host.node.config import Host
from guestagent.linux.cgroup.process_memory import CgroupMemoryUse
from guestagent.linux.fs import KernelFS
from guestagent.linux.meminfo import read_system_memory, read_system_pressure


@dataclass(frozen=True)
class HostMemory:
    mem_total: int
    mem_available: int
    psi_some_avg10: float | None  # % of the last 10 s; None on a host without PSI.


def read_host(fs: KernelFS) -> HostMemory:
    memory = read_system_memory(fs)
    pressure = read_system_pressure(fs)
    some = None if pressure is None else pressure.some.avg10
    return HostMemory(memory.mem_total, memory.mem_available, some)


def host_short(host: HostMemory, policy: Host) -> str | None:
    """Why the host is short of memory, or None."""
    if host.psi_some_avg10 is not None and host.psi_some_avg10 >= policy.short_psi_some_avg10:
        return (
            f"host memory stall {host.psi_some_avg10:.1f}% of the last 10 s "
            f"(short from {policy.short_psi_some_avg10:g}%)"
        )
    if host.mem_available < policy.short_available * host.mem_total:
        return (
            f"host MemAvailable {mib(host.mem_available)} of {mib(host.mem_total)} "
            f"(short under {policy.short_available:.0%})"
        )
    return None


def cgroup_near_limit(use: CgroupMemoryUse | None, policy: Host) -> str | None:
    """Why the VMM's host cgroup is near its memory.max, or None (no limit, or room)."""
    if use is None or use.limit is None:
        return None
    if use.current + policy.cgroup_margin < use.limit:
        return None
    return (
        f"the VMM's cgroup {use.path} holds {mib(use.current)} of its memory.max "
        f"{mib(use.limit)} (kept {mib(policy.cgroup_margin)} under)"
    )


@dataclass(frozen=True)
class Headroom:
    bytes: int  # Left in the guest above its safe figure.
    reason: str


def headroom(host: HostMemory, use: CgroupMemoryUse | None, policy: Host) -> Headroom:
    """What one VM keeps above its safe figure now, and why."""
    short = host_short(host, policy) or cgroup_near_limit(use, policy)
    if short is not None:
        return Headroom(0, f"down to the safe figure: {short}")
    return Headroom(policy.headroom, f"the host has room: {mib(policy.headroom)} headroom kept")
