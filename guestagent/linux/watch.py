"""Kernel change signals for WatchMemory: inotify on memory.events, and a PSI trigger.

The kernel tells us when something changed, so a watcher reacts within milliseconds
instead of polling fast. Both sources feed one asyncio queue; closing frees the inotify
instance and the PSI trigger (each trigger is kernel state tied to its open file).
"""

from __future__ import annotations

import asyncio
import enum
import errno
import os
import select
import struct
from dataclasses import dataclass
from pathlib import Path

from guestagent.errors import AgentError, InvalidArgument
from guestagent.jsonlog import EventLog
from guestagent.linux import syscalls
from guestagent.linux.fs import KernelFS

log = EventLog("guestagent.linux.watch")

_EVENT_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len

# The kernel accepts PSI windows of 500 ms to 10 s.
PSI_MIN_WINDOW_US = 500_000
PSI_MAX_WINDOW_US = 10_000_000
DEFAULT_TRIGGER_STALL_US = 150_000
DEFAULT_TRIGGER_WINDOW_US = 1_000_000


class Signal(enum.Enum):
    MEMORY_EVENTS = "memory_events"
    PRESSURE = "pressure"


@dataclass(frozen=True)
class PressureTriggerSpec:
    stall_us: int = DEFAULT_TRIGGER_STALL_US
    window_us: int = DEFAULT_TRIGGER_WINDOW_US
    full: bool = False

    def line(self) -> bytes:
        """The text written to a PSI file to arm the trigger (NUL-terminated, as documented)."""
        kind = "full" if self.full else "some"
        return f"{kind} {self.stall_us} {self.window_us}".encode() + b"\0"


def pressure_trigger_spec(stall_us: int, window_us: int, full: bool) -> PressureTriggerSpec:
    """Validate a requested trigger; zeros mean the default."""
    if stall_us == 0 and window_us == 0:
        return PressureTriggerSpec(full=full)
    if not PSI_MIN_WINDOW_US <= window_us <= PSI_MAX_WINDOW_US:
        raise InvalidArgument(
            f"pressure trigger window {window_us} us is outside "
            f"{PSI_MIN_WINDOW_US}..{PSI_MAX_WINDOW_US} us"
        )
    if not 0 < stall_us < window_us:
        raise InvalidArgument(
            f"pressure trigger stall {stall_us} us must be above 0 and below window {window_us} us"
        )
    return PressureTriggerSpec(stall_us, window_us, full)


def parse_inotify_events(data: bytes) -> list[int]:
    """The watch descriptors named in a read() of an inotify fd."""
    descriptors: list[int] = []
    offset = 0
    while offset + _EVENT_HEADER.size <= len(data):
        wd, _mask, _cookie, name_len = _EVENT_HEADER.unpack_from(data, offset)
        descriptors.append(wd)
        offset += _EVENT_HEADER.size + name_len
    return descriptors


class _Inotify:
    def __init__(self) -> None:
        self.fd = syscalls.inotify_init()

    def add_watch(self, path: Path) -> int:
        return syscalls.inotify_add_watch(self.fd, path, syscalls.IN_MODIFY)

    def read_descriptors(self) -> list[int]:
        try:
            return parse_inotify_events(os.read(self.fd, 64 * 1024))
        except BlockingIOError:
            return []

    def close(self) -> None:
        os.close(self.fd)


class KernelSignals:
    """One watcher's kernel signal sources, delivered as (Signal, cgroup names) on a queue."""

    def __init__(
        self,
        fs: KernelFS,
        memory_events: dict[str, Path],
        trigger: PressureTriggerSpec | None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[Signal, str | None]] = asyncio.Queue()
        self._inotify: _Inotify | None = None
        self._names_by_wd: dict[int, str] = {}
        self._psi_fd: int | None = None
        self._psi_epoll: select.epoll | None = None
        try:
            if memory_events:
                self._watch_memory_events(memory_events)
            if trigger is not None:
                self._arm_pressure_trigger(fs, fs.proc("pressure", "memory"), trigger)
        except BaseException:
            self.close()
            raise

    def _watch_memory_events(self, memory_events: dict[str, Path]) -> None:
        self._inotify = _Inotify()
        for name, path in memory_events.items():
            self._names_by_wd[self._inotify.add_watch(path)] = name
        self._loop.add_reader(self._inotify.fd, self._on_inotify)

    def _arm_pressure_trigger(self, fs: KernelFS, path: Path, trigger: PressureTriggerSpec) -> None:
        try:
            fd = fs.open(path, os.O_RDWR | os.O_NONBLOCK)
        except AgentError as e:
            if e.errno == errno.ENOENT:
                return  # No PSI in this kernel: the watch runs on its interval alone.
            raise
        # A PSI file always polls readable; the trigger is signalled as POLLPRI only,
        # so an epoll set listening for EPOLLPRI is what the event loop watches.
        epoll = select.epoll()
        try:
            # Registering first refuses a file that cannot be polled (EPERM on a plain
            # file in a fake tree) before the trigger text is written into it.
            epoll.register(fd, select.EPOLLPRI)
            os.write(fd, trigger.line())
        except OSError as e:
            epoll.close()
            os.close(fd)
            log.warning("pressure_trigger_unavailable", path=str(path), errno=e.errno, error=str(e))
            return
        self._psi_fd, self._psi_epoll = fd, epoll
        self._loop.add_reader(epoll.fileno(), self._on_pressure)

    def _on_inotify(self) -> None:
        if self._inotify is None:  # Closed while the callback was queued.
            return
        for wd in self._inotify.read_descriptors():
            name = self._names_by_wd.get(wd)
            if name is not None:
                self.queue.put_nowait((Signal.MEMORY_EVENTS, name))

    def _on_pressure(self) -> None:
        if self._psi_epoll is None:  # Closed while the callback was queued.
            return
        if self._psi_epoll.poll(0):
            self.queue.put_nowait((Signal.PRESSURE, None))

    def close(self) -> None:
        if self._inotify is not None:
            self._loop.remove_reader(self._inotify.fd)
            self._inotify.close()
            self._inotify = None
        if self._psi_epoll is not None:
            self._loop.remove_reader(self._psi_epoll.fileno())
            self._psi_epoll.close()
            self._psi_epoll = None
        if self._psi_fd is not None:
            os.close(self._psi_fd)
            self._psi_fd = None

    def __enter__(self) -> KernelSignals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
