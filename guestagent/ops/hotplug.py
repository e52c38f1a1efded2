"""Online hot-plugged memory: the host plugs a DIMM, the guest must online its blocks.

The kernel leaves hot-added blocks offline here (no MEMORY_HOTPLUG_DEFAULT_ONLINE), so the
agent onlines them at start and on every udev "memory" add event. "online_movable" puts them
in ZONE_MOVABLE, which the host can unplug again later; "online" lets the kernel choose.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guestagent.errors import AgentError, InvalidArgument
from guestagent.jsonlog import EventLog
from guestagent.linux.fs import KernelFS
from guestagent.linux.meminfo import read_system_memory

log = EventLog("guestagent.ops.hotplug")

ONLINE_STATES = ("online", "online_movable", "online_kernel")


@dataclass(frozen=True)
class OnlineResult:
    onlined: tuple[str, ...]
    failed: tuple[str, ...]  # "memory42: write ...: EBUSY ..." for blocks the kernel refused.
    mem_total: int
    block_size: int


def memory_root(fs: KernelFS) -> Path:
    return fs.sys("devices", "system", "memory")


def block_size_bytes(fs: KernelFS) -> int:
    # The kernel prints it in hex without a 0x prefix.
    return int(fs.read(memory_root(fs) / "block_size_bytes").strip(), 16)


def memory_blocks(fs: KernelFS) -> dict[str, str]:
    """Each memoryN block's state (online, offline, ...), by name."""
    root = memory_root(fs)
    if not fs.is_dir(root):
        return {}
    blocks = {}
    for name in fs.listdir(root):
        if name.startswith("memory") and name[6:].isdigit():
            state = fs.read_optional(root / name / "state")
            if state is not None:
                blocks[name] = state.strip()
    return blocks


def online_memory(fs: KernelFS, state: str = "online") -> OnlineResult:
    if state not in ONLINE_STATES:
        raise InvalidArgument(f"online state {state!r} is not one of {', '.join(ONLINE_STATES)}")
    onlined, failed = [], []
    offline = sorted(
        (name for name, s in memory_blocks(fs).items() if s == "offline"),
        key=lambda name: int(name[6:]),
    )
    for name in offline:
        try:
            fs.write(memory_root(fs) / name / "state", state)
            onlined.append(name)
        except AgentError as e:
            failed.append(f"{name}: {e}")
    result = OnlineResult(
        tuple(onlined), tuple(failed), read_system_memory(fs).mem_total, block_size_bytes(fs)
    )
    if onlined or failed:
        log.info(
            "memory_onlined",
            blocks=len(onlined),
            failed=list(failed),
            mem_total=result.mem_total,
            state=state,
        )
    return result


class HotplugWatcher:
    """Onlines memory when udev says a block was added, on a thread of its own."""

    def __init__(self, fs: KernelFS, state: str) -> None:
        self.fs = fs
        self.state = state
        self._lock = threading.Lock()  # Blocks appear in bursts; one pass at a time.
        self._observer: Any = None

    def online_now(self) -> OnlineResult:
        with self._lock:
            return online_memory(self.fs, self.state)

    def start(self) -> None:
        import pyudev

        monitor = pyudev.Monitor.from_netlink(pyudev.Context())
        monitor.filter_by("memory")

        def on_device(device: Any) -> None:
            if device.action == "add":
                self.online_now()

        self._observer = pyudev.MonitorObserver(monitor, callback=on_device, name="memory-hotplug")
        self._observer.start()
        self.online_now()  # After the monitor starts, so no block is missed in between.

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
