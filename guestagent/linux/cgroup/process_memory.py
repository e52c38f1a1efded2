"""The memory cgroup a process runs in, and its use against its limit: what a host reads of
a VMM process (the node daemon keeps a VM under its pod's limit). cgroup v2's memory.current
and memory.max where the memory controller is in the unified hierarchy; on a hybrid host
(v1 controllers, an empty v2 mount beside them) the v1 memory controller's
memory.usage_in_bytes and memory.limit_in_bytes."""

from __future__ import annotations

import os

from guestagent.errors import KernelFormat
from guestagent.linux.fs import KernelFS, parsed
from guestagent.records import record

# v1's memory.limit_in_bytes when unlimited: PAGE_COUNTER_MAX pages, rounded down to a page
# (9223372036854771712 with 4 KiB pages); anything this large is no limit.
V1_UNLIMITED = 1 << 62


@record
class CgroupMemoryUse:
    path: str  # Below the controller's mount, "/" for the root.
    current: int
    limit: int | None  # None: "max" (or v1's unlimited).


def parse_cgroup_lines(text: str) -> dict[str, str]:
    """/proc/PID/cgroup as {controller: path}: "" for the v2 line (`0::/path`), each v1
    controller of a line (`4:memory:/path`) by name."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        hierarchy, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep and sep2 and hierarchy.isdigit()):
            raise KernelFormat(f"cgroup line {line!r} is not ID:CONTROLLERS:PATH")
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def parse_unified_cgroup(text: str) -> str:
    """/proc/PID/cgroup's cgroup v2 line, `0::/path`."""
    path = parse_cgroup_lines(text).get("")
    if path is None:
        raise KernelFormat(f"no cgroup v2 line (0::/path) in {text!r}")
    return path


def _limit(text: str | None, unlimited: int | None = None) -> int | None:
    if text is None or text.strip() == "max":
        return None
    value = int(text)
    return None if unlimited is not None and value >= unlimited else value


def read_cgroup_memory(fs: KernelFS, pid: int) -> CgroupMemoryUse | None:
    """The memory cgroup of process `pid`; None once the process is gone, or when it is in
    the root (whose use is the machine's, which meminfo says)."""
    cgroup_file = fs.proc(str(pid), "cgroup")
    text = fs.read_optional(cgroup_file)
    if text is None:
        return None
    paths = parsed(cgroup_file, text, parse_cgroup_lines)
    if "" in paths:
        directory = os.path.join(fs.cgroup_root, paths[""].lstrip("/"))
        current = fs.read_optional(os.path.join(directory, "memory.current"))
        if current is not None:
            limit = fs.read_optional(os.path.join(directory, "memory.max"))
            return CgroupMemoryUse(paths[""], int(current), _limit(limit))
    if paths.get("memory", "/") == "/":
        return None
    directory = os.path.join(fs.cgroup_root, "memory", paths["memory"].lstrip("/"))
    usage = fs.read_optional(os.path.join(directory, "memory.usage_in_bytes"))
    if usage is None:
        return None
    limit = fs.read_optional(os.path.join(directory, "memory.limit_in_bytes"))
    return CgroupMemoryUse(paths["memory"], int(usage), _limit(limit, V1_UNLIMITED))
