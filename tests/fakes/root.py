"""A fake kernel file tree under a temp dir, for tests that run without a VM.

The tree is plain files. What a kernel does beyond storing a write (fail with an errno,
round a value, make a cgroup's files on mkdir) is played by handlers on the FakeKernel that
every FakeRoot.fs goes through: tests add them, and never patch KernelFS itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from guestagent.errors import kernel_error
from guestagent.linux.fs import KernelFS
from guestagent.linux.kernel import Kernel

# Do the operation (with this value, for a write); a handler may call it, or not, or twice.
Proceed = Callable[[str], None]
# A handler of one operation: the path, the value written ("" for mkdir and rmdir), and what
# carries the operation on (the next handler, and in the end the file system).
Handler = Callable[[Path, str, Proceed], None]
OPERATIONS = {"write": "write", "mkdir": "make directory", "rmdir": "remove directory"}


@dataclass
class FakeKernel:
    handlers: dict[str, list[Handler]] = field(default_factory=dict)

    def on(self, op: str, handler: Handler) -> None:
        """Run handler on every `op` (write, mkdir, rmdir); the last added runs first."""
        self.handlers.setdefault(op, []).append(handler)

    def fail(self, op: str, where: Path | str, number: int, after: int = 0) -> None:
        """Fail `op` on a path (or on any path with that file name) with errno `number`,
        once `after` of them have gone through."""
        passed = 0

        def failing(path: Path, value: str, proceed: Proceed) -> None:
            nonlocal passed
            if path != where and path.name != where:
                proceed(value)
            elif passed < after:
                passed += 1
                proceed(value)
            else:
                error = OSError(number, os.strerror(number))
                raise kernel_error(OPERATIONS[op], path, value if op == "write" else None, error)

        self.on(op, failing)

    def run(self, op: str, path: Path, value: str, last: Proceed) -> None:
        chain = last
        for handler in self.handlers.get(op, []):
            chain = _link(handler, path, chain)
        chain(value)


def _link(handler: Handler, path: Path, proceed: Proceed) -> Proceed:
    return lambda value: handler(path, value, proceed)


@dataclass(frozen=True)
class FakeKernelFS(Kernel):
    """A KernelFS over the fake tree whose writes, mkdirs and rmdirs go through its kernel."""

    kernel: FakeKernel = field(default_factory=FakeKernel, compare=False)

    # KernelFS deals in str paths; handlers get a Path, as the tests build theirs.
    def write(self, path: str, value: str) -> None:
        self.kernel.run("write", Path(path), value, lambda v: KernelFS.write(self, path, v))

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        self.kernel.run("mkdir", Path(path), "", lambda _: KernelFS.mkdir(self, path, mode))

    def rmdir(self, path: str) -> None:
        self.kernel.run("rmdir", Path(path), "", lambda _: KernelFS.rmdir(self, path))


MEMINFO = """\
MemTotal:         498764 kB
MemFree:          301212 kB
MemAvailable:     398100 kB
Buffers:            2048 kB
Cached:            80124 kB
SwapCached:            0 kB
Active(anon):      20480 kB
Inactive(anon):    10240 kB
Active(file):      40960 kB
Inactive(file):    30720 kB
SwapTotal:       1048572 kB
SwapFree:        1048572 kB
Shmem:              1024 kB
SReclaimable:       8192 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""

BUDDYINFO = """\
Node 0, zone      DMA      1      0      0      0      0      0      0      0      1      1      3
Node 0, zone    DMA32      2      3      3      1      2      2      1      5      5      3    751
Node 1, zone   Normal     10     20      0      0      0      0      0      0      0      0      1
"""

PRESSURE = """\
some avg10=1.50 avg60=0.25 avg300=0.05 total=123456
full avg10=0.50 avg60=0.10 avg300=0.01 total=65432
"""

MEMORY_STAT = "anon 1048576\nfile 2097152\nkernel 4096\nshmem 0\n"
MEMORY_EVENTS = "low 0\nhigh 3\nmax 2\noom 1\noom_kill 1\n"


@dataclass
class FakeRoot:
    root: Path
    kernel: FakeKernel = field(default_factory=FakeKernel)

    @property
    def fs(self) -> FakeKernelFS:
        return FakeKernelFS(self.root, kernel=self.kernel)

    def write(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def add_mapping(self, name: str, sysname: str, dev: str, *slaves: str) -> None:
        """A device-mapper device as sysfs shows it: /sys/block/dm-N/{dev,dm/name,slaves/}."""
        self.write(f"sys/block/{sysname}/dev", f"{dev}\n")
        self.write(f"sys/block/{sysname}/dm/name", f"{name}\n")
        (self.root / f"sys/block/{sysname}/slaves").mkdir(exist_ok=True)
        for slave in slaves:
            (self.root / f"sys/block/{sysname}/slaves/{slave}").mkdir()

    def add_memory_blocks(self, states: dict[int, str]) -> None:
        """Memory blocks of 128 MiB in the given states, online ones in ZONE_NORMAL."""
        memory = "sys/devices/system/memory"
        self.write(f"{memory}/block_size_bytes", "8000000\n")
        for index, state in states.items():
            self.write(f"{memory}/memory{index}/state", f"{state}\n")
            if state == "online":
                self.write(f"{memory}/memory{index}/valid_zones", "Normal\n")

    def add_cgroup(
        self,
        name: str,
        current: int = 3 * 1024 * 1024,
        max_: str = "max",
        swap: bool = True,
        psi: bool = True,
    ) -> Path:
        directory = self.root / "sys/fs/cgroup" / name
        directory.mkdir(parents=True, exist_ok=True)
        files = {
            "memory.current": f"{current}\n",
            "memory.max": f"{max_}\n",
            "memory.high": "max\n",
            "memory.low": "0\n",
            "memory.min": "0\n",
            "memory.stat": MEMORY_STAT,
            "memory.events": MEMORY_EVENTS,
        }
        if swap:
            files |= {"memory.swap.current": "4096\n", "memory.swap.max": "max\n"}
        if psi:
            files["memory.pressure"] = PRESSURE
        for file, text in files.items():
            (directory / file).write_text(text)
        return directory


def make_fake_root(root: Path, psi: bool = True) -> FakeRoot:
    fake = FakeRoot(root)
    fake.write("proc/meminfo", MEMINFO)
    if psi:
        fake.write("proc/pressure/memory", PRESSURE)
    (root / "sys/fs/cgroup").mkdir(parents=True, exist_ok=True)
    fake.write("sys/fs/cgroup/cgroup.subtree_control", "memory\n")
    return fake
