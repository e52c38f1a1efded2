"""GetMemoryInfo's answer: the memory report, its idle ages and give-back figures, and the
reclaimer's status for the cgroups it acts on among those asked about."""

from __future__ import annotations

from dataclasses import dataclass, field

from guestagent.linux.confidential import Confidential
from guestagent.linux.delayacct import DelayStallMeter
from guestagent.linux.kernel import Kernel
from guestagent.linux.memblocks import HotplugReportCache
from guestagent.linux.meminfo import MemoryReport, read_report
from guestagent.linux.statefile import state_unavailable
from guestagent.ops.giveback import IdleReport, idle_report
from guestagent.ops.idle import IdleSpec, IdleState
from guestagent.ops.workingset.reclaimer import Reclaimer, TargetStatus


@dataclass(frozen=True)
class InfoSpec:
    cgroups: tuple[str, ...] = ()
    idle: IdleSpec = field(default_factory=IdleSpec)


@dataclass(frozen=True)
class Report:
    report: MemoryReport
    confidential: Confidential
    reclaim: tuple[TargetStatus, ...] = ()
    # Why the agent does not persist its state, "" when it does.
    state_unavailable: str = ""
    idle: IdleReport | None = None


def memory_info(
    fs: Kernel,
    spec: InfoSpec,
    reclaimer: Reclaimer,
    hotplug: HotplugReportCache,
    confidential: Confidential,
    idle: IdleState,
    stall: DelayStallMeter | None = None,
) -> Report:
    report = read_report(fs, spec.cgroups, hotplug, stall)
    return Report(
        report,
        confidential,
        reclaimer.known(spec.cgroups),
        state_unavailable(fs),
        idle_report(fs, report, idle, spec.idle),
    )
