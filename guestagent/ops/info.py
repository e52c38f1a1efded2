"""The memory report as the host gets it, by GetMemoryInfo and by each WatchMemory message
alike: the kernel's figures, their idle ages and give-back figures, the reclaimer's status for
the cgroups it acts on among those asked about, and what kind of guest this is."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import field
from typing import TYPE_CHECKING

from guestagent.jsonlog import EventLog
from guestagent.linux.cgroup.memory import CgroupMemory
from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.confidential import NONE, Confidential
from guestagent.linux.delayacct import DelayStallMeter
from guestagent.linux.giveback_sources import GiveBackSources, read_giveback_sources
from guestagent.linux.kernel import Kernel
from guestagent.linux.memblocks import HotplugReportCache
from guestagent.linux.meminfo import (
    MemoryReport,
    SystemReading,
    read_cgroup,
    read_cgroups,
    read_system,
    report_of,
)
from guestagent.linux.statestore import state_unavailable
from guestagent.ops.giveback_figures import GiveBackFigures, giveback_figures
from guestagent.ops.idle import IdleAger, IdleSpec, IdleState
from guestagent.ops.limits import BEING_MADE, CgroupsBeingMade
from guestagent.ops.shared_reads import SharedReads
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

# Calls that come within this long of a reading of the kernel's files share it rather than
# read their own (docs/contract.md says the bound): under TCG a report's reads took most of its
# 40 ms of CPU, and 200 callers each read the same files.
SHARE_WINDOW_S = 0.1
# Readings kept past the window: a call that queued behind others asks from when it came.
KEEP_READINGS_S = 10.0
# Cgroups whose last change is remembered before the old ones are dropped.
MAX_CHANGES_KEPT = 256


@record
class SystemSnapshot:
    """The kernel's figures every report takes, whatever its cgroups, read together."""

    reading: SystemReading
    sources: GiveBackSources
    state_unavailable: str


@record
class Readings:
    """What one call's report is made of. Two calls whose Readings hold the same readings (the
    same objects: a shared reading is one object for every call that takes it) and equal
    statuses get the same report from report_from, so an answer encoded for one serves both
    (agent/shared_answers.py)."""

    snapshot: SystemSnapshot
    cgroups: tuple[CgroupMemory, ...]
    removed: tuple[str, ...]
    reclaim: tuple[TargetStatus, ...]
    ages: IdleState | None

    def same_as(self, other: Readings) -> bool:
        return (
            self.snapshot is other.snapshot
            and self.ages is other.ages
            and len(self.cgroups) == len(other.cgroups)
            and all(a is b for a, b in zip(self.cgroups, other.cgroups, strict=True))
            and self.removed == other.removed
            and self.reclaim == other.reclaim
        )


class Reporter:
    """What a report is read from. One per agent, shared by GetMemoryInfo and every stream;
    a part left None (a test's) leaves its figures out of the report. Reports share their
    readings of the kernel's files: the system's, and each cgroup's (shared_reads.py)."""

    def __init__(
        self,
        kernel: Kernel,
        confidential: Confidential = NOT_CONFIDENTIAL,
        built_reclaimer: Callable[[], Reclaimer | None] | None = None,
        ager: IdleAger | None = None,
        stall: DelayStallMeter | None = None,
        being_made: CgroupsBeingMade = BEING_MADE,
        window_s: float = SHARE_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """built_reclaimer: the reclaimer if it is built (until something sets or asks for a
        policy there is none: agent/on_first_use.py). ager: its state as of each report.
        being_made: a cgroup SetMemoryLimits is making is read once its limits are written."""
        self.kernel = kernel
        self.confidential = confidential
        self.built_reclaimer = built_reclaimer
        self.ager = ager
        self.stall = stall
        self.being_made = being_made
        self.window_s = window_s
        self._clock = clock
        self._hotplug = HotplugReportCache()
        self._system: SharedReads[None, SystemSnapshot] = SharedReads(
            lambda _: self._read_system(), KEEP_READINGS_S, clock
        )
        self._cgroups: SharedReads[CgroupName, CgroupMemory] = SharedReads(
            self._read_cgroup, KEEP_READINGS_S, clock
        )
        self._cgroup_stall: DelayStallMeter | None = None
        # When the agent last changed what readings show: all of them, the system's figures,
        # each cgroup's. A reading taken before is taken by no call after.
        self._all_changed_at = -math.inf
        self._system_changed_at = -math.inf
        self._cgroup_changed_at: dict[CgroupName, float] = {}

    def fresh_from(self) -> float:
        """How fresh a reading a call that comes now takes: started within the window."""
        return self._clock() - self.window_s

    def changed(self, cgroups: tuple[CgroupName, ...] | None = None, system: bool = True) -> None:
        """The agent changed what reports show: every reading (cgroups None), or the named
        cgroups' and, with system, the system's. Calls then take only readings started
        after it, so a caller sees its own SetMemoryLimits; a change to one cgroup leaves the
        others' readings, and the system's, shared (a runtime starting containers sets
        limits many times a second)."""
        now = self._clock()
        if cgroups is None:
            self._all_changed_at = now
            return
        if system:
            self._system_changed_at = now
        for name in cgroups:
            self._cgroup_changed_at[name] = now
        if len(self._cgroup_changed_at) > MAX_CHANGES_KEPT:
            # A change older than a reading can be kept concerns no reading any more.
            self._cgroup_changed_at = {
                name: at
                for name, at in self._cgroup_changed_at.items()
                if now - at < KEEP_READINGS_S
            }

    def _wait_for_makings(self, cgroups: tuple[CgroupName, ...]) -> None:
        if cgroups and not self.being_made.wait_for(cgroups):
            log.warning("report_read_while_making", cgroups=list(cgroups))

    def report(
        self, spec: InfoSpec, removed_ok: bool = False, fresh_from: float | None = None
    ) -> Report:
        """fresh_from: the monotonic time its readings must have started at or after, fixed
        when the call came (fresh_from()); None means now's. removed_ok lists an asked-for
        cgroup that does not exist in the report's `removed` (a stream's, after its first
        message) instead of refusing the call."""
        return self.report_from(spec, self.readings(spec, removed_ok, fresh_from))

    def readings(
        self, spec: InfoSpec, removed_ok: bool = False, fresh_from: float | None = None
    ) -> Readings:
        """What report() makes its report of, read (or shared) as it says."""
        since = max(self.fresh_from() if fresh_from is None else fresh_from, self._all_changed_at)
        begun = self.being_made.begun(spec.cgroups) if spec.cgroups else 0
        self._wait_for_makings(spec.cgroups)
        snapshot = self._system.get(None, max(since, self._system_changed_at))

        def cgroup(name: CgroupName) -> CgroupMemory:
            return self._cgroups.get(name, max(since, self._cgroup_changed_at.get(name, since)))

        cgroups, removed = read_cgroups(spec.cgroups, cgroup, removed_ok)
        if spec.cgroups and self.being_made.begun(spec.cgroups) != begun:
            # A making began after the wait, so this read may hold a cgroup between its
            # mkdir and its limits: read again once it is done, from then on.
            self._wait_for_makings(spec.cgroups)
            since = self._clock()
            cgroups, removed = read_cgroups(spec.cgroups, cgroup, removed_ok)
        return Readings(
            snapshot,
            cgroups,
            removed,
            self._reclaim_statuses(spec.cgroups),
            self.ager.state if self.ager is not None else None,
        )

    def report_from(self, spec: InfoSpec, readings: Readings) -> Report:
        """The report of these readings: a function of them and of spec alone."""
        snapshot = readings.snapshot
        report = report_of(snapshot.reading, readings.cgroups, readings.removed)
        return Report(
            report,
            self.confidential,
            readings.reclaim,
            snapshot.state_unavailable,
            (
                giveback_figures(snapshot.sources, report, readings.ages, spec.idle)
                if readings.ages is not None
                else None
            ),
        )

    def _read_system(self) -> SystemSnapshot:
        reading = read_system(self.kernel, self._hotplug, self.stall)
        self._cgroup_stall = self.stall if reading.cgroups_delayacct else None
        return SystemSnapshot(
            reading,
            read_giveback_sources(self.kernel, reading.system, reading.hotplug),
            state_unavailable(self.kernel),
        )

    def _read_cgroup(self, name: CgroupName) -> CgroupMemory:
        return read_cgroup(self.kernel, name, self._cgroup_stall)

    def _reclaim_statuses(self, cgroups: tuple[CgroupName, ...]) -> tuple[TargetStatus, ...]:
        reclaimer = self.built_reclaimer() if self.built_reclaimer is not None else None
        return reclaimer.known(cgroups) if reclaimer is not None else ()
