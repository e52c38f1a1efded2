"""The working-set reclaimer as calls see it: SetReclaimPolicy's request and the status of
each target, apart from the reclaimer itself (reclaimer.py), which the agent loads only when
a policy is set or kept from before a restart (or named by --reclaim): the status of a
reclaimer with no policy is answered here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field

from guestagent.errors import NotFound
from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.delayacct import PSI_STALL
from guestagent.linux.features import Absent
from guestagent.ops.workingset.compaction_trigger import CompactionStatus
from guestagent.ops.workingset.policy import Mode, ReclaimPolicy
from guestagent.records import record

# What every target's steps are judged on beside its stall source (TargetStatus.signals): the
# refault guard, and pgscan/pgsteal per chunk. The stall is PSI's where the cgroup has
# memory.pressure, else delay accounting's; with neither it does not run at all
# (docs/design-reclaimer.md: Without PSI).
GUARDS = ("refaults", "reclaim_yield")


@record
class ReclaimPolicyRequest:
    """SetReclaimPolicy: turn the reclaimer on or off for a cgroup, with a policy."""

    cgroup: CgroupName
    enabled: bool
    policy: ReclaimPolicy = field(default_factory=ReclaimPolicy)


@record
class WorkloadReclaimRequest:
    """SetReclaimPolicy with `workloads`: the reclaimer on or off, with a policy, for every
    cgroup the agent takes for a workload, now and as they come (workloads.py)."""

    enabled: bool
    policy: ReclaimPolicy = field(default_factory=ReclaimPolicy)


@record
class TargetStatus:
    cgroup: str
    enabled: bool
    policy: ReclaimPolicy
    mode: Mode
    why: str
    reclaimed_total: int
    reclaimed_last: int
    last_stall_us: int
    last_refault_bytes: int
    intervals: int
    current: int
    floor: int
    signals: tuple[str, ...] = (PSI_STALL, *GUARDS)
    # Kernel features the target runs without, each with why (the multi-gen LRU).
    absent: tuple[Absent, ...] = ()
    # Which way the last step went ("evict_cold" or "probe", policy.StepKind; "" before the
    # first), how long its writes took, and what each way has taken in all.
    last_step: str = ""
    last_step_us: int = 0
    evicted_cold_total: int = 0
    probed_total: int = 0


@record
class ReclaimOverview:
    """GetReclaimStatus's answer."""

    targets: tuple[TargetStatus, ...]
    compaction: CompactionStatus


def no_reclaim_policy(missing: Sequence[str]) -> NotFound:
    """GetReclaimStatus naming cgroups the reclaimer has no policy for."""
    return NotFound(
        f"the reclaimer has no policy for cgroup(s) {', '.join(missing)}",
        "NO_RECLAIM_POLICY",
        metadata={"cgroups": ",".join(missing)},
    )


def overview_without_policies(cgroups: Sequence[str]) -> ReclaimOverview:
    """GetReclaimStatus's answer from a reclaimer with no policy at all, as a new one gives
    it: no targets (NOT_FOUND for any cgroup named) and a compaction trigger that has not
    checked yet. Answered without loading the reclaimer (agent/daemon.py says when)."""
    if cgroups:
        raise no_reclaim_policy(cgroups)
    return ReclaimOverview((), CompactionStatus())
