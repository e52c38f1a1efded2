"""Proactive reclaim: ask the kernel to reclaim a cgroup's memory now (memory.reclaim).

Reclaimed pages go to swap or, if file-backed, are dropped, so a balloon that inflates
afterwards takes memory the workload was not using. drop_caches is offered for callers that
want the whole page cache gone first; it is off unless asked for, since the guest loses
its cache and pays for it in I/O afterwards.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

from guestagent.errors import AgentError, FailedPrecondition, InvalidArgument
from guestagent.jsonlog import EventLog
from guestagent.linux.cgroups import cgroup_dir
from guestagent.linux.fs import KernelFS
from guestagent.linux.meminfo import read_current

log = EventLog("guestagent.ops.reclaim")


@dataclass(frozen=True)
class ReclaimResult:
    cgroup: str
    requested_bytes: int
    current_before: int
    current_after: int
    complete: bool  # False: the kernel reclaimed less than asked (EAGAIN).
    dropped_caches: int  # The drop_caches level written first, 0 for none.


def validate_reclaim(bytes_: int, drop_caches: int) -> None:
    if bytes_ <= 0:
        raise InvalidArgument(f"reclaim size {bytes_} must be a positive number of bytes")
    if drop_caches not in (0, 1, 2, 3):
        raise InvalidArgument(f"drop_caches level {drop_caches} is not 0, 1, 2 or 3")


def write_memory_reclaim(fs: KernelFS, control: Path, request: str) -> bool:
    """Write one request to memory.reclaim; False when the kernel got less (EAGAIN), which is
    a partial result, not an error. Other errors are raised as they are."""
    try:
        fs.write(control, request)
    except AgentError as e:
        if e.errno != errno.EAGAIN:
            raise
        return False
    return True


def reclaim(fs: KernelFS, cgroup: str, bytes_: int, drop_caches: int = 0) -> ReclaimResult:
    validate_reclaim(bytes_, drop_caches)
    directory = cgroup_dir(fs, cgroup)
    control = directory / "memory.reclaim"
    if not fs.exists(control):
        raise FailedPrecondition(f"{control} is missing: memory.reclaim needs Linux 5.19 or later")
    before = read_current(fs, directory, cgroup)
    if drop_caches:
        fs.write(fs.proc("sys", "vm", "drop_caches"), str(drop_caches))
    complete = write_memory_reclaim(fs, control, str(bytes_))
    after = read_current(fs, directory, cgroup)
    log.info(
        "reclaimed", cgroup=cgroup, requested=bytes_, before=before, after=after, complete=complete
    )
    return ReclaimResult(cgroup, bytes_, before, after, complete, drop_caches)
