"""The memory report: /proc/meminfo, PSI (or delay accounting's stall), and per-cgroup memory
files.

Parsing is pure (text in, frozen values out) and kept apart from the reads. A kernel
feature that is off (PSI, swap accounting) is reported as None, never as zero.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

from guestagent.errors import AgentError, FailedPrecondition, KernelFormat, NotFound
from guestagent.linux.cgroup.memory import CgroupMemory, memory_cgroup
from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.delayacct import DelayStallMeter
from guestagent.linux.features import Absent, read_absent
from guestagent.linux.fs import KernelFS
from guestagent.linux.memblocks import HotplugReport, HotplugReportCache, read_hotplug_report
from guestagent.linux.psi import Pressure, read_pressure
from guestagent.linux.vmstat import VmStat, read_vmstat
from guestagent.records import record


@record
class SystemMemory:
    mem_total: int
    mem_free: int
    mem_available: int
    buffers: int
    cached: int
    swap_total: int
    swap_free: int
    shmem: int
    # For the give-back figures (ops/giveback_figures.py), from the same read; 0 where a
    # kernel lacks the lines.
    lru_anon: int = 0  # Active(anon) + Inactive(anon): shmem is here too.
    lru_file: int = 0  # Active(file) + Inactive(file).
    reclaimable_slab: int = 0  # SReclaimable.


@record
class MemoryReport:
    collected_at_unix_ns: int
    system: SystemMemory
    pressure: Pressure | None
    cgroups: tuple[CgroupMemory, ...]
    hotplug: HotplugReport | None = None  # None: the kernel has no memory hotplug
    vmstat: VmStat | None = None  # None without /proc/vmstat (a test tree).
    absent: tuple[Absent, ...] = ()  # Kernel features this guest lacks, each with why.
    delay_stall_us: int | None = None  # As CgroupMemory's, for every process in the guest.
    # Cgroups asked for that do not exist now (a watch stream's, which outlive containers).
    removed: tuple[str, ...] = ()


_MEMINFO_FIELDS = {
    "MemTotal": "mem_total",
    "MemFree": "mem_free",
    "MemAvailable": "mem_available",
    "Buffers": "buffers",
    "Cached": "cached",
    "SwapTotal": "swap_total",
    "SwapFree": "swap_free",
    "Shmem": "shmem",
}


def parse_meminfo(text: str) -> dict[str, int]:
    """All /proc/meminfo lines as bytes ("kB" lines) or plain counts (HugePages_*)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or not fields:
            continue
        try:
            number = int(fields[0])
        except ValueError:
            raise KernelFormat(f"meminfo line {line!r} has no number") from None
        values[key.strip()] = number * 1024 if fields[1:] == ["kB"] else number
    return values


def system_memory_from(values: dict[str, int]) -> SystemMemory:
    missing = [key for key in _MEMINFO_FIELDS if key not in values]
    if missing:
        raise FailedPrecondition(
            f"/proc/meminfo lacks {', '.join(missing)}",
            "KERNEL_FILE_MISSING",
            metadata={"path": "/proc/meminfo", "missing": ",".join(missing)},
        )
    return SystemMemory(
        **{attr: values[key] for key, attr in _MEMINFO_FIELDS.items()},
        lru_anon=values.get("Active(anon)", 0) + values.get("Inactive(anon)", 0),
        lru_file=values.get("Active(file)", 0) + values.get("Inactive(file)", 0),
        reclaimable_slab=values.get("SReclaimable", 0),
    )


def read_system_memory(fs: KernelFS) -> SystemMemory:
    return system_memory_from(fs.read_parsed(fs.proc("meminfo"), parse_meminfo))


def read_system_pressure(fs: KernelFS) -> Pressure | None:
    """/proc/pressure/memory, None on a kernel without PSI."""
    return read_pressure(fs, fs.proc("pressure", "memory"))


def read_present_cgroups(
    fs: KernelFS, cgroups: tuple[CgroupName, ...]
) -> tuple[list[tuple[CgroupMemory, str]], tuple[str, ...]]:
    """The cgroups that exist, read, with their directories, and the names of those that do
    not: missing, or removed while their files were read (rmdir takes them all at once, so a
    directory that is gone afterwards is what tells the two apart from a missing file)."""
    found: list[tuple[CgroupMemory, str]] = []
    removed: list[str] = []
    for name in cgroups:
        try:
            cgroup = memory_cgroup(fs, name)
            found.append((cgroup.read(), cgroup.directory))
        except NotFound:
            removed.append(name)
        except AgentError:
            if fs.is_dir(os.path.join(fs.cgroup_root, name)):
                raise
            removed.append(name)
    return found, tuple(removed)


def read_report(
    fs: KernelFS,
    cgroups: tuple[CgroupName, ...] = (),
    hotplug: HotplugReportCache | None = None,
    stall: DelayStallMeter | None = None,
    removed_ok: bool = False,
) -> MemoryReport:
    """hotplug: the cache that spares re-reading the hotplug section; None reads it afresh.
    stall: delay accounting's meter, read where PSI is not (or is, when it is preferred).
    removed_ok lists a cgroup that does not exist in `removed` instead of refusing it."""
    if removed_ok:
        present, removed = read_present_cgroups(fs, cgroups)
    else:
        named = [memory_cgroup(fs, name) for name in cgroups]  # Each found before any is read.
        present, removed = [(cgroup.read(), cgroup.directory) for cgroup in named], ()
    found = [cgroup for cgroup, _ in present]
    system = read_system_memory(fs)
    pressure = read_system_pressure(fs)
    absent = read_absent(fs)
    delay_stall_us = None
    if stall is not None:
        delay_absent = stall.absence()
        if delay_absent is not None:
            absent = (*absent, delay_absent)
        else:
            if stall.stands_in(pressure is not None):
                delay_stall_us = stall.guest_total_us()
            measured = []
            for cgroup, directory in present:
                if stall.stands_in(cgroup.pressure is not None):
                    try:
                        cgroup = replace(cgroup, delay_stall_us=stall.total_us(directory))
                    except AgentError:
                        if not removed_ok or fs.is_dir(directory):
                            raise
                        removed = (*removed, cgroup.path)  # Removed since it was read.
                        continue
                measured.append(cgroup)
            found = measured
    return MemoryReport(
        collected_at_unix_ns=time.time_ns(),
        system=system,
        pressure=pressure,
        cgroups=tuple(found),
        hotplug=hotplug.report(fs, system.mem_total) if hotplug else read_hotplug_report(fs),
        vmstat=read_vmstat(fs),
        absent=absent,
        delay_stall_us=delay_stall_us,
        removed=removed,
    )
