"""GetMemoryInfo's answer: the memory report, and the reclaimer's status for the cgroups it
acts on among those asked about."""

from __future__ import annotations

from dataclasses import dataclass

from guestagent.linux.confidential import Confidential
from guestagent.linux.fs import KernelFS
from guestagent.linux.memblocks import HotplugReportCache
from guestagent.linux.meminfo import MemoryReport, read_report
from guestagent.linux.statefile import state_unavailable
from guestagent.ops.workingset.reclaimer import Reclaimer, TargetStatus


@dataclass(frozen=True)
class Report:
    report: MemoryReport
    confidential: Confidential
    reclaim: tuple[TargetStatus, ...] = ()
    # Why the agent does not persist its state, "" when it does.
    state_unavailable: str = ""


def memory_info(
    fs: KernelFS,
    cgroups: tuple[str, ...],
    reclaimer: Reclaimer,
    hotplug: HotplugReportCache,
    confidential: Confidential,
) -> Report:
    return Report(
        read_report(fs, cgroups, hotplug),
        confidential,
        reclaimer.known(cgroups),
        state_unavailable(fs),
    )
