"""/proc/vmstat: the event counters a host policy reads beside the memory report.

Counters only grow (until reboot), so a host takes deltas between two reports: swap traffic
(pswpin/pswpout), major faults, refaults of evicted pages, OOM kills, direct reclaim and
compaction stalls.
"""

from __future__ import annotations

from dataclasses import fields

from guestagent.linux.fs import KernelFS
from guestagent.linux.keyed import parse_flat_keyed, workingset_refaults
from guestagent.records import record


@record
class VmStat:
    pswpin: int
    pswpout: int
    pgmajfault: int
    workingset_refault_anon: int
    workingset_refault_file: int
    oom_kill: int
    allocstall: int  # Sum of allocstall_* (one counter per zone type since 4.x).
    compact_stall: int


def vmstat_from(values: dict[str, int]) -> VmStat:
    """Each counter is the line of its name (0 where the kernel has none), but for two."""
    counters = {f.name: values.get(f.name, 0) for f in fields(VmStat)}
    anon, file = workingset_refaults(values)
    counters.update(workingset_refault_anon=anon, workingset_refault_file=file)
    counters["allocstall"] = sum(v for k, v in values.items() if k.startswith("allocstall"))
    return VmStat(**counters)


def read_vmstat(fs: KernelFS) -> VmStat | None:
    text = fs.read_optional(fs.proc("vmstat"))
    return vmstat_from(parse_flat_keyed(text)) if text is not None else None
