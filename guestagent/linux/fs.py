"""The one place that knows where the kernel's files are.

Production uses root "/"; unit tests point it at a fake tree under a temp dir, so every
module reads and writes kernel files through a KernelFS and none hard-codes /proc or /sys.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KernelFS:
    root: Path = Path("/")
    # Where cgroup2 is mounted, relative to root.
    cgroup_mount: str = "sys/fs/cgroup"

    def proc(self, *parts: str) -> Path:
        return self.root.joinpath("proc", *parts)

    def sys(self, *parts: str) -> Path:
        return self.root.joinpath("sys", *parts)

    def dev(self, *parts: str) -> Path:
        return self.root.joinpath("dev", *parts)

    def run(self, *parts: str) -> Path:
        """/run: a tmpfs that outlives an agent restart but not a reboot, as kernel state does."""
        return self.root.joinpath("run", *parts)

    @property
    def cgroup_root(self) -> Path:
        return self.root / self.cgroup_mount

    @functools.cached_property
    def resolved_cgroup_root(self) -> Path:
        """The mount with symlinks resolved, once: every cgroup path is checked against it."""
        return self.cgroup_root.resolve()

    @property
    def is_real(self) -> bool:
        """True when this is the live kernel, where syscalls (swapon) match the files."""
        return self.root.resolve() == Path("/")

    def host_path(self, kernel_path: str | os.PathLike[str]) -> Path:
        """Map an absolute path as the kernel names it (/dev/vdb) into this tree."""
        path = Path(kernel_path)
        return self.root.joinpath(*path.parts[1:]) if path.is_absolute() else self.root / path


def read_text(path: Path) -> str:
    # os-level calls: kernel files are small, and a text-mode file object costs several
    # times the read itself on the memory report's hot path.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("ascii", errors="replace")


def read_optional(path: Path) -> str | None:
    """Read a file whose absence means a kernel feature is off (PSI, swap accounting)."""
    try:
        return read_text(path)
    except FileNotFoundError:
        return None
