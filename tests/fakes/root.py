"""A fake kernel file tree under a temp dir, for tests that run without a VM."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from guestagent.linux.fs import KernelFS

MEMINFO = """\
MemTotal:         498764 kB
MemFree:          301212 kB
MemAvailable:     398100 kB
Buffers:            2048 kB
Cached:            80124 kB
SwapCached:            0 kB
SwapTotal:       1048572 kB
SwapFree:        1048572 kB
Shmem:              1024 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
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

    @property
    def fs(self) -> KernelFS:
        return KernelFS(self.root)

    def write(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

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
