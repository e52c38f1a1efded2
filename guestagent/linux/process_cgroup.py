"""The cgroup v2 a process runs in, and that cgroup's memory use against its limit: what a
host reads of a VMM process (the node daemon keeps a VM under its pod's memory.max)."""

from __future__ import annotations

import os

from guestagent.errors import KernelFormat
from guestagent.linux.fs import KernelFS, parsed
from guestagent.records import record


@record
class CgroupMemoryUse:
    path: str  # Below the cgroup2 mount, "/" for the root.
    current: int
    limit: int | None  # None: "max", or the root, which has no memory.max.


def parse_unified_cgroup(text: str) -> str:
    """/proc/PID/cgroup's cgroup v2 line, `0::/path`."""
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, sep, path = rest.partition(":")
        if hierarchy == "0" and sep and not controllers:
            return path
    raise KernelFormat(f"no cgroup v2 line (0::/path) in {text!r}")


def read_cgroup_memory(fs: KernelFS, pid: int) -> CgroupMemoryUse | None:
    """The memory cgroup of process `pid`; None once the process is gone."""
    cgroup_file = fs.proc(str(pid), "cgroup")
    text = fs.read_optional(cgroup_file)
    if text is None:
        return None
    path = parsed(cgroup_file, text, parse_unified_cgroup)
    directory = os.path.join(fs.cgroup_root, path.lstrip("/"))
    current = fs.read_optional(os.path.join(directory, "memory.current"))
    if current is None:  # The root: the whole machine's, which meminfo says.
        return None
    limit = fs.read_optional(os.path.join(directory, "memory.max"))
    bound = None if limit is None or limit.strip() == "max" else int(limit)
    return CgroupMemoryUse(path, int(current), bound)
