"""The memory report as the host gets it, by GetMemoryInfo and by each WatchMemory message
alike: the kernel's figures, their idle ages and give-back figures, the reclaimer's status for
the cgroups it acts on among those asked about, and what kind of guest this is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import TYPE_CHECKING

from guestagent.jsonlog import EventLog
from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.confidential import NONE, Confidential
from guestagent.linux.delayacct import DelayStallMeter
from guestagent.linux.kernel import Kernel
from guestagent.linux.memblocks import HotplugReportCache
from guestagent.linux.meminfo import MemoryReport, read_report
from guestagent.linux.statestore import state_unavailable
from guestagent.ops.giveback_figures import GiveBackFigures, giveback_figures
from guestagent.ops.idle import IdleAger, IdleSpec
from guestagent.ops.limits import BEING_MADE, CgroupsBeingMade
from guestagent.ops.workingset.status import TargetStatus
from guestagent.records import record

if TYPE_CHECKING:
    from guestagent.ops.workingset.reclaimer import Reclaimer


@record
class InfoSpec:
    cgroups: tuple[CgroupName, ...] = ()
    idle: IdleSpec = field(default_factory=IdleSpec)


@record
class Report:
    report: MemoryReport
    confidential: Confidential
    reclaim: tuple[TargetStatus, ...] = ()
    # Why the agent does not persist its state, "" when it does.
    state_unavailable: str = ""
    idle: GiveBackFigures | None = None


log = EventLog("guestagent.ops.info")

NOT_CONFIDENTIAL = Confidential(NONE, "")


@record
class Reporter:
    """What a report is read from. One per agent, shared by GetMemoryInfo and every stream;
    a part left None (a test's) leaves its figures out of the report."""

    kernel: Kernel
    hotplug: HotplugReportCache = field(default_factory=HotplugReportCache)
    confidential: Confidential = NOT_CONFIDENTIAL
    # The reclaimer if it is built: until something sets or asks for a policy, there is none
    # (the agent builds it at first use: agent/on_first_use.py).
    built_reclaimer: Callable[[], Reclaimer | None] | None = None
    ager: IdleAger | None = None  # Its state as of each report.
    stall: DelayStallMeter | None = None
    # A cgroup SetMemoryLimits is making is read once its limits are written.
    being_made: CgroupsBeingMade = BEING_MADE

    def report(self, spec: InfoSpec, removed_ok: bool = False) -> Report:
        """removed_ok lists an asked-for cgroup that does not exist in the report's `removed`
        (a stream's, after its first message) instead of refusing the call."""
        if spec.cgroups and not self.being_made.wait_for(spec.cgroups):
            log.warning("report_read_while_making", cgroups=list(spec.cgroups))
        report = read_report(self.kernel, spec.cgroups, self.hotplug, self.stall, removed_ok)
        return Report(
            report,
            self.confidential,
            self._reclaim_statuses(spec.cgroups),
            state_unavailable(self.kernel),
            (
                giveback_figures(self.kernel, report, self.ager.state, spec.idle)
                if self.ager is not None
                else None
            ),
        )

    def _reclaim_statuses(self, cgroups: tuple[CgroupName, ...]) -> tuple[TargetStatus, ...]:
        reclaimer = self.built_reclaimer() if self.built_reclaimer is not None else None
        return reclaimer.known(cgroups) if reclaimer is not None else ()
