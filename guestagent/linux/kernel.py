"""What ops/ and agent/ hold of the kernel: a Kernel, built from the root and the cgroup2
mount, handed to linux/'s typed readers and writers, and giving a handle per cgroup. They
never import linux/fs.py, so no file name is assembled outside linux/ (tests/unit/test_layout.py).
"""

from __future__ import annotations

from guestagent.linux.cgroup.memory import MemoryCgroup, memory_cgroup
from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.fs import KernelFS
from guestagent.records import record


@record
class Kernel(KernelFS):
    def cgroup(self, name: CgroupName) -> MemoryCgroup:
        """The memory controller of an existing cgroup (linux/cgroup/memory.py)."""
        return memory_cgroup(self, name)
