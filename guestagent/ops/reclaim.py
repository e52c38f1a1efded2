"""Proactive reclaim: ask the kernel to reclaim a cgroup's memory now (memory.reclaim).

Reclaimed pages go to swap or, if file-backed, are dropped, so a balloon that inflates
afterwards takes memory the workload was not using. drop_caches is offered for callers that
want the whole page cache gone first; it is off unless asked for, since the guest loses
its cache and pays for it in I/O afterwards.
"""

from __future__ import annotations

from guestagent.errors import InvalidArgument
from guestagent.jsonlog import EventLog
from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.kernel import Kernel
from guestagent.linux.mm import drop_caches as drop_caches_now
from guestagent.records import record

log = EventLog("guestagent.ops.reclaim")


@record
class ReclaimSpec:
    cgroup: CgroupName
    bytes: int
    drop_caches: int = 0  # The drop_caches level to write first, 0 for none.


@record
class ReclaimResult:
    cgroup: str
    current_before: int
    current_after: int
    complete: bool  # False: the kernel reclaimed less than asked (EAGAIN).


def validate_reclaim(bytes_: int, drop_caches: int) -> None:
    if bytes_ <= 0:
        raise InvalidArgument(
            f"reclaim size {bytes_} must be a positive number of bytes",
            "RECLAIM_SIZE_INVALID",
            field="bytes",
        )
    if drop_caches not in (0, 1, 2, 3):
        raise InvalidArgument(
            f"drop_caches level {drop_caches} is not 0, 1, 2 or 3",
            "DROP_CACHES_INVALID",
            field="drop_caches",
        )


def reclaim(kernel: Kernel, spec: ReclaimSpec) -> ReclaimResult:
    cgroup, bytes_, drop_caches = spec.cgroup, spec.bytes, spec.drop_caches
    validate_reclaim(bytes_, drop_caches)
    memory = kernel.cgroup(cgroup)
    memory.require_reclaim()
    before = memory.current()
    if drop_caches:
        drop_caches_now(kernel, drop_caches)
    complete = memory.reclaim(str(bytes_))
    after = memory.current()
    log.info(
        "reclaimed", cgroup=cgroup, requested=bytes_, before=before, after=after, complete=complete
    )
    return ReclaimResult(cgroup, before, after, complete)
