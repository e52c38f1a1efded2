"""The working-set reclaimer as calls see it: SetReclaimPolicy's request and the status of
each target, apart from the reclaimer itself (reclaimer.py), which the agent loads only when
a policy is set, asked after, or kept from before a restart.
"""

from __future__ import annotations

from dataclasses import field

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

    cgroup: str
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


@record
class ReclaimOverview:
    """GetReclaimStatus's answer."""

    targets: tuple[TargetStatus, ...]
    compaction: CompactionStatus
