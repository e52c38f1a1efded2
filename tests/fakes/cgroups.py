"""cgroupfs's mkdir and rmdir on the fake tree, for the tests of cgroups, limits and the
agent's own cgroup."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from guestagent.errors import kernel_error
from tests.fakes.root import MEMORY_EVENTS, MEMORY_STAT, FakeRoot, Proceed


@dataclass
class FakeCgroupKernel:
    """What cgroupfs does on mkdir and rmdir, played on the regular files of the fake tree.

    A new cgroup gets cgroup.subtree_control, and the memory.* files when its parent's
    subtree_control lists memory; rmdir takes the interface files away with the directory.
    """

    fake: FakeRoot
    memory: bool = True  # False: the memory files never appear, as with no memory controller.
    swap: bool = True
    fail_mkdir: str | None = None  # A directory name whose mkdir fails with ENOSPC.

    def install(self) -> FakeCgroupKernel:
        def mkdir(path: Path, value: str, proceed: Proceed) -> None:
            existed = path.is_dir()
            if self._inside(path) and path.name == self.fail_mkdir:
                error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                raise kernel_error("make directory", path, None, error)
            proceed(value)
            if self._inside(path) and not existed:
                self._populate(path)

        def rmdir(path: Path, value: str, proceed: Proceed) -> None:
            if self._inside(path):
                for entry in path.iterdir():
                    if entry.is_file():
                        entry.unlink()
            proceed(value)

        self.fake.kernel.on("mkdir", mkdir)
        self.fake.kernel.on("rmdir", rmdir)
        return self

    def _inside(self, path: Path) -> bool:
        mount = (self.fake.root / "sys/fs/cgroup").resolve()
        return mount in path.resolve().parents

    def _populate(self, directory: Path) -> None:
        (directory / "cgroup.subtree_control").write_text("")
        parent_enabled = [
            token.removeprefix("+")
            for token in (directory.parent / "cgroup.subtree_control").read_text().split()
            if not token.startswith("-")
        ]
        if not self.memory or "memory" not in parent_enabled:
            return
        files = {
            "memory.current": "0\n",
            "memory.max": "max\n",
            "memory.high": "max\n",
            "memory.low": "0\n",
            "memory.min": "0\n",
            "memory.stat": MEMORY_STAT,
            "memory.events": MEMORY_EVENTS,
        }
        if self.swap:
            files |= {"memory.swap.current": "0\n", "memory.swap.max": "max\n"}
        for name, text in files.items():
            (directory / name).write_text(text)
