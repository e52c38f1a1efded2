"""The processes in a cgroup: which cgroup this process runs in (/proc/self/cgroup), who else
is in one (cgroup.procs), and moving a process in (ops/self_cgroup.py's questions)."""

from __future__ import annotations

import os

from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.fs import KernelFS


def own_cgroup(proc_self_cgroup: str) -> str | None:
    """The cgroup2 path in /proc/self/cgroup ("0::/x" -> "/x"); None without cgroup2."""
    for line in proc_self_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            return path
    return None


def move_process(fs: KernelFS, name: CgroupName, pid: int) -> None:
    fs.write(os.path.join(fs.cgroup_root, name, "cgroup.procs"), str(pid))


def read_cgroup_procs(fs: KernelFS, path: str) -> tuple[int, ...]:
    """The processes in a cgroup named as /proc/self/cgroup names it ("/a/b"); () if gone."""
    text = fs.read_optional(os.path.join(fs.cgroup_root, path.lstrip("/"), "cgroup.procs"))
    return tuple(int(line) for line in (text or "").split())


def read_own_cgroup(fs: KernelFS) -> str | None:
    """The cgroup2 cgroup this process runs in, None without cgroup2 (or without /proc)."""
    return own_cgroup(fs.read_optional(fs.proc("self", "cgroup")) or "")
