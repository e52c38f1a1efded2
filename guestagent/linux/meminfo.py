"""The memory report: /proc/meminfo, PSI (or delay accounting's stall), and per-cgroup memory
files.

Parsing is pure (text in, frozen values out) and kept apart from the reads. A kernel
feature that is off (PSI, swap accounting) is reported as None, never as zero.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from guestagent.errors import AgentError, FailedPrecondition, KernelFormat, NotFound, quoted
from guestagent.linux.cgroups import cgroup_dir
from guestagent.linux.delayacct import DelayStallMeter
from guestagent.linux.features import Absent, read_absent
from guestagent.linux.fs import KernelFS, parsed
from guestagent.linux.keyed import parse_flat_keyed
from guestagent.linux.memblocks import HotplugReport, HotplugReportCache, read_hotplug_report
from guestagent.linux.vmstat import VmStat, read_vmstat

UNLIMITED = None  # How a "max" limit is represented: no number at all.


@dataclass(frozen=True)
class SystemMemory:
    mem_total: int
    mem_free: int
    mem_available: int
    buffers: int
    cached: int
    swap_total: int
    swap_free: int
    shmem: int
    # For the give-back figures (ops/giveback.py), from the same read; 0 where a kernel lacks
    # the lines.
    lru_anon: int = 0  # Active(anon) + Inactive(anon): shmem is here too.
    lru_file: int = 0  # Active(file) + Inactive(file).
    reclaimable_slab: int = 0  # SReclaimable.


@dataclass(frozen=True)
class PressureLine:
    avg10: float
    avg60: float
    avg300: float
    total_us: int


@dataclass(frozen=True)
class Pressure:
    some: PressureLine
    full: PressureLine


@dataclass(frozen=True)
class MemoryEvents:
    low: int = 0
    high: int = 0
    max: int = 0
    oom: int = 0
    oom_kill: int = 0


@dataclass(frozen=True)
class CgroupSwap:
    current: int
    max: int | None


@dataclass(frozen=True)
class CgroupMemory:
    path: str
    current: int
    max: int | None
    high: int | None
    low: int
    # None when the kernel does no swap accounting (no memory.swap.* files).
    swap: CgroupSwap | None
    events: MemoryEvents
    pressure: Pressure | None
    anon: int
    file: int
    # The subtree's LRU pages as memory.stat counts them (shmem with anon, as the LRU has
    # it), for the give-back figures.
    lru_anon: int = 0
    lru_file: int = 0
    # Delay accounting's stall total (delayacct.py), where there is no PSI; else None.
    delay_stall_us: int | None = None


@dataclass(frozen=True)
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


def parse_pressure(text: str) -> Pressure:
    """A PSI file: 'some avg10=0.00 avg60=0.00 avg300=0.00 total=0' and a 'full' line."""
    lines: dict[str, PressureLine] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        kind, *pairs = line.split()
        fields = dict(pair.partition("=")[::2] for pair in pairs)
        try:
            lines[kind] = PressureLine(
                avg10=float(fields["avg10"]),
                avg60=float(fields["avg60"]),
                avg300=float(fields["avg300"]),
                total_us=int(fields["total"]),
            )
        except (KeyError, ValueError):
            raise KernelFormat(f"pressure line {line!r} is malformed") from None
    if "some" not in lines:
        raise KernelFormat(f"pressure text {text!r} has no 'some' line")
    # Kernels before 5.13 print no 'full' line for the system-wide cpu file only;
    # memory always has it, but a zero line keeps the type total.
    return Pressure(some=lines["some"], full=lines.get("full", PressureLine(0.0, 0.0, 0.0, 0)))


def parse_limit(text: str) -> int | None:
    """A cgroup limit file: 'max' is unlimited (None), otherwise bytes."""
    value = text.strip()
    if value == "max":
        return UNLIMITED
    try:
        return int(value)
    except ValueError:
        raise KernelFormat(f"limit {value!r} is neither 'max' nor bytes") from None


def memory_events_from(values: dict[str, int]) -> MemoryEvents:
    return MemoryEvents(
        low=values.get("low", 0),
        high=values.get("high", 0),
        max=values.get("max", 0),
        oom=values.get("oom", 0),
        oom_kill=values.get("oom_kill", 0),
    )


def read_system_memory(fs: KernelFS) -> SystemMemory:
    return system_memory_from(fs.read_parsed(fs.proc("meminfo"), parse_meminfo))


def read_pressure(fs: KernelFS, path: Path) -> Pressure | None:
    text = fs.read_optional(path)
    return parsed(path, text, parse_pressure) if text is not None else None


def read_system_pressure(fs: KernelFS) -> Pressure | None:
    """/proc/pressure/memory, None on a kernel without PSI."""
    return read_pressure(fs, fs.proc("pressure", "memory"))


def read_current(fs: KernelFS, directory: Path, name: str) -> int:
    """memory.current of a cgroup, or why it has none."""
    current = fs.read_optional(directory / "memory.current")
    if current is None:
        raise FailedPrecondition(
            f"cgroup {quoted(name)} has no memory.current: the memory controller is not enabled "
            "in its parent's cgroup.subtree_control",
            "MEMORY_CONTROLLER_OFF",
            metadata={"cgroup": name},
        )
    return parsed(directory / "memory.current", current, int)


def read_cgroup_dir(fs: KernelFS, directory: Path, name: str) -> CgroupMemory:
    current = read_current(fs, directory, name)
    swap_current = fs.read_optional(directory / "memory.swap.current")
    swap_max = fs.read_optional(directory / "memory.swap.max")
    stat = fs.read_parsed(directory / "memory.stat", parse_flat_keyed)
    return CgroupMemory(
        path=name,
        current=current,
        max=fs.read_parsed(directory / "memory.max", parse_limit),
        high=fs.read_parsed(directory / "memory.high", parse_limit),
        low=fs.read_int(directory / "memory.low"),
        swap=CgroupSwap(
            parsed(directory / "memory.swap.current", swap_current, int),
            parsed(directory / "memory.swap.max", swap_max, parse_limit),
        )
        if swap_current is not None and swap_max is not None
        else None,
        events=memory_events_from(fs.read_parsed(directory / "memory.events", parse_flat_keyed)),
        pressure=read_pressure(fs, directory / "memory.pressure"),
        anon=stat.get("anon", 0),
        file=stat.get("file", 0),
        lru_anon=stat.get("active_anon", 0) + stat.get("inactive_anon", 0),
        lru_file=stat.get("active_file", 0) + stat.get("inactive_file", 0),
    )


def read_present_cgroups(
    fs: KernelFS, cgroups: tuple[str, ...]
) -> tuple[list[tuple[CgroupMemory, Path]], tuple[str, ...]]:
    """The cgroups that exist, read, with their directories, and the names of those that do
    not: missing, or removed while their files were read (rmdir takes them all at once, so a
    directory that is gone afterwards is what tells the two apart from a missing file)."""
    found: list[tuple[CgroupMemory, Path]] = []
    removed: list[str] = []
    for name in cgroups:
        try:
            directory = cgroup_dir(fs, name)
            found.append((read_cgroup_dir(fs, directory, name), directory))
        except NotFound:
            removed.append(name)
        except AgentError:
            if fs.is_dir(fs.cgroup_root / name):
                raise
            removed.append(name)
    return found, tuple(removed)


def read_report(
    fs: KernelFS,
    cgroups: tuple[str, ...] = (),
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
        named = [(cgroup_dir(fs, name), name) for name in cgroups]  # Refuse bad names first.
        present, removed = [(read_cgroup_dir(fs, d, name), d) for d, name in named], ()
    found = [cgroup for cgroup, _ in present]
    directories = [directory for _, directory in present]
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
                delay_stall_us = stall.total_us(fs.cgroup_root)
            measured = []
            for cgroup, directory in zip(found, directories, strict=True):
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
