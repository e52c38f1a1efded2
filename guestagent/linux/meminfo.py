"""The memory report: /proc/meminfo, PSI (or delay accounting's stall), and per-cgroup memory
files.

Parsing is pure (text in, frozen values out) and kept apart from the reads. A kernel
feature that is off (PSI, swap accounting) is reported as None, never as zero.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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


@record
class SystemReading:
    """What every report reads, whatever cgroups it names: the guest's memory, its stall, the
    features it lacks, its hot-plugged memory and its counters."""

    system: SystemMemory
    pressure: Pressure | None
    absent: tuple[Absent, ...]
    hotplug: HotplugReport | None
    vmstat: VmStat | None
    delay_stall_us: int | None
    # Whether the cgroups' stall comes from delay accounting too (it answers, and stands in
    # for PSI or is preferred to it).
    cgroups_delayacct: bool
    collected_at_unix_ns: int


def read_system(
    fs: KernelFS, hotplug: HotplugReportCache | None = None, stall: DelayStallMeter | None = None
) -> SystemReading:
    """hotplug: the cache that spares re-reading the hotplug section; None reads it afresh.
    stall: delay accounting's meter, read where PSI is not (or is, when it is preferred)."""
    system = read_system_memory(fs)
    pressure = read_system_pressure(fs)
    absent = read_absent(fs)
    delay_stall_us = None
    delayacct = False
    if stall is not None:
        delay_absent = stall.absence()
        if delay_absent is not None:
            absent = (*absent, delay_absent)
        else:
            delayacct = True
            if stall.stands_in(pressure is not None):
                delay_stall_us = stall.guest_total_us()
    return SystemReading(
        system,
        pressure,
        absent,
        hotplug.report(fs, system.mem_total) if hotplug else read_hotplug_report(fs),
        read_vmstat(fs),
        delay_stall_us,
        delayacct,
        time.time_ns(),
    )


def read_cgroup(
    fs: KernelFS, name: CgroupName, stall: DelayStallMeter | None = None
) -> CgroupMemory:
    """One cgroup's memory files, and its delay-accounting stall where that stands in for PSI
    (`stall`: the meter, when delay accounting answers). NotFound when the cgroup does not
    exist, or was removed while its files were read (rmdir takes them all at once, so a
    directory that is gone afterwards is what tells that apart from a missing file)."""
    cgroup = memory_cgroup(fs, name)
    try:
        memory = cgroup.read()
        if stall is not None and stall.stands_in(memory.pressure is not None):
            memory = replace(memory, delay_stall_us=stall.total_us(cgroup.directory))
    except NotFound:
        raise
    except AgentError:
        if fs.is_dir(cgroup.directory):
            raise
        memory_cgroup(fs, name)  # Gone: its own NotFound says so.
        raise
    return memory


def report_of(
    system: SystemReading,
    cgroups: tuple[CgroupMemory, ...] = (),
    removed: tuple[str, ...] = (),
) -> MemoryReport:
    return MemoryReport(
        collected_at_unix_ns=system.collected_at_unix_ns,
        system=system.system,
        pressure=system.pressure,
        cgroups=cgroups,
        hotplug=system.hotplug,
        vmstat=system.vmstat,
        absent=system.absent,
        delay_stall_us=system.delay_stall_us,
        removed=removed,
    )


def read_cgroups(
    names: tuple[CgroupName, ...],
    read: Callable[[CgroupName], CgroupMemory],
    removed_ok: bool,
) -> tuple[tuple[CgroupMemory, ...], tuple[str, ...]]:
    """The named cgroups by `read` (read_cgroup, or a shared reading of it): removed_ok lists
    one that does not exist in the second tuple instead of refusing it with NotFound."""
    found: list[CgroupMemory] = []
    removed: list[str] = []
    for name in names:
        try:
            found.append(read(name))
        except NotFound:
            if not removed_ok:
                raise
            removed.append(name)
    return tuple(found), tuple(removed)


def read_report(
    fs: KernelFS,
    cgroups: tuple[CgroupName, ...] = (),
    hotplug: HotplugReportCache | None = None,
    stall: DelayStallMeter | None = None,
    removed_ok: bool = False,
) -> MemoryReport:
    """The whole report read at once (read_system, then read_cgroup for each); removed_ok
    lists a cgroup that does not exist in `removed` instead of refusing it."""
    system = read_system(fs, hotplug, stall)
    meter = stall if system.cgroups_delayacct else None
    found, removed = read_cgroups(cgroups, lambda name: read_cgroup(fs, name, meter), removed_ok)
    return report_of(system, found, removed)
