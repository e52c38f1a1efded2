"""Kernel change signals for WatchMemory: inotify on memory.events, and a PSI trigger.

The kernel tells us when something changed, so a watcher reacts within milliseconds
instead of polling fast. One SignalHub holds both for the whole agent; each stream gets a
queue of its own, and its watches and trigger are freed with its last stream (a trigger is
kernel state tied to its open file).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import os
import select
import struct

from guestagent.errors import (
    AgentError,
    InvalidArgument,
    ResourceExhausted,
    errno_text,
    kernel_error,
)
from guestagent.jsonlog import EventLog, Repeats
from guestagent.linux import syscalls
from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.fs import KernelFS
from guestagent.records import record

log = EventLog("guestagent.linux.watch")
repeats = Repeats(log)

_EVENT_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len

# The kernel accepts PSI windows of 500 ms to 10 s.
PSI_MIN_WINDOW_US = 500_000
PSI_MAX_WINDOW_US = 10_000_000
DEFAULT_TRIGGER_STALL_US = 150_000
DEFAULT_TRIGGER_WINDOW_US = 1_000_000


class Signal(enum.Enum):
    MEMORY_EVENTS = "memory_events"
    PRESSURE = "pressure"


@record
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
            f"{PSI_MIN_WINDOW_US}..{PSI_MAX_WINDOW_US} us",
            "PRESSURE_TRIGGER_INVALID",
            field="pressure_trigger.window_us",
        )
    if not 0 < stall_us < window_us:
        raise InvalidArgument(
            f"pressure trigger stall {stall_us} us must be above 0 and below window {window_us} us",
            "PRESSURE_TRIGGER_INVALID",
            field="pressure_trigger.stall_us",
        )
    return PressureTriggerSpec(stall_us, window_us, full)


def parse_inotify_events(data: bytes) -> list[tuple[int, int, str]]:
    """(watch descriptor, event mask, entry name or "") of each event in a read() of an
    inotify fd; a directory's watch names the entry an event is about."""
    events: list[tuple[int, int, str]] = []
    offset = 0
    while offset + _EVENT_HEADER.size <= len(data):
        wd, mask, _cookie, name_len = _EVENT_HEADER.unpack_from(data, offset)
        start = offset + _EVENT_HEADER.size
        name = data[start : start + name_len].rstrip(b"\0")
        events.append((wd, mask, name.decode(errors="surrogateescape")))
        offset = start + name_len
    return events


# A watched cgroup came or went (mkdir, rmdir, or a rename: cgroupfs renames within a parent).
PARENT_EVENTS = (
    syscalls.IN_CREATE | syscalls.IN_DELETE | syscalls.IN_MOVED_FROM | syscalls.IN_MOVED_TO
)

# Caps on what streams may watch: inotify watches and queue entries are kernel memory the
# agent pays for, and each watched cgroup is read on every message.
MAX_WATCHES_PER_STREAM = 256
DEFAULT_MAX_WATCHES = 4096


class _Inotify:
    def __init__(self) -> None:
        try:
            self.fd = syscalls.inotify_init()
        except OSError as e:
            raise kernel_error("open", "inotify instance", None, e) from None

    def add_watch(self, path: str, mask: int = syscalls.IN_MODIFY) -> int:
        try:
            return syscalls.inotify_add_watch(self.fd, path, mask)
        except OSError as e:
            if e.errno == errno.ENOSPC:  # fs.inotify.max_user_watches reached.
                raise ResourceExhausted(
                    f"inotify watch on {path}: {errno_text(e)} (fs.inotify.max_user_watches)",
                    "INOTIFY_WATCHES_EXHAUSTED",
                    metadata={"path": path},
                ) from None
            raise kernel_error("watch", path, None, e) from None

    def remove_watch(self, wd: int) -> None:
        # EINVAL: the kernel dropped the watch already (its cgroup was removed).
        with contextlib.suppress(OSError):
            syscalls.inotify_rm_watch(self.fd, wd)

    def read_events(self) -> list[tuple[int, int, str]]:
        try:
            return parse_inotify_events(os.read(self.fd, 64 * 1024))
        except BlockingIOError:
            return []

    def close(self) -> None:
        os.close(self.fd)


class _Trigger:
    """One armed PSI trigger, shared by every stream that asked for the same one."""

    def __init__(self, fd: int, epoll: select.epoll) -> None:
        self.fd, self.epoll = fd, epoll
        self.subscribers: set[KernelSignals] = set()

    def close(self) -> None:
        self.epoll.close()
        os.close(self.fd)


class SignalHub:
    """The agent's kernel signal sources, shared by every stream: one inotify instance, with a
    watch per distinct memory.events file, and one PSI trigger per distinct trigger.

    An inotify instance per stream ran into fs.inotify.max_user_instances (128 for every root
    process in the guest, systemd and udev included); the kernel gives the same watch
    descriptor for the same file in one instance, so watches are counted per descriptor and
    removed with their last stream. The instance itself is closed when nothing is watched.
    """

    def __init__(
        self,
        fs: KernelFS,
        max_watches: int = DEFAULT_MAX_WATCHES,
        max_per_stream: int = MAX_WATCHES_PER_STREAM,
    ) -> None:
        self.fs = fs
        self.max_watches = max_watches
        self.max_per_stream = max_per_stream
        self.watched = 0  # Cgroups watched, summed over streams.
        self._inotify: _Inotify | None = None
        self._by_wd: dict[int, set[KernelSignals]] = {}
        # The watched cgroups' parent directories: their mkdir and rmdir show there.
        self._parents_by_wd: dict[int, set[KernelSignals]] = {}
        self._triggers: dict[PressureTriggerSpec, _Trigger] = {}

    def subscribe(
        self, memory_events: dict[CgroupName, str], trigger: PressureTriggerSpec | None
    ) -> KernelSignals:
        """A stream's signals; ResourceExhausted names the cap a stream would go over."""
        wanted = len(memory_events)
        if wanted > self.max_per_stream:
            raise InvalidArgument(
                f"a stream watches at most {self.max_per_stream} cgroups per stream; "
                f"this one asks {wanted}",
                "WATCH_TOO_MANY_CGROUPS",
                field="cgroups",
                metadata={"bound": self.max_per_stream},
            )
        if self.watched + wanted > self.max_watches:
            raise ResourceExhausted(
                f"{self.watched} of the agent's {self.max_watches} watched cgroups are in use "
                f"(--max-watches); this stream asks {wanted} more",
                "WATCHES_EXHAUSTED",
                metadata={"bound": self.max_watches},
            )
        signals = KernelSignals(self, tuple(memory_events))
        self.watched += wanted
        try:
            for name, path in memory_events.items():
                self.watch(signals, name, path)
            if trigger is not None:
                self._subscribe_trigger(signals, trigger)
        except BaseException:
            signals.close()
            raise
        return signals

    def watch(self, signals: KernelSignals, name: CgroupName, path: str) -> None:
        """Watch one of a stream's cgroups (again, once a removed one is back), through its
        memory.events (`path`), and its parent directory for its rmdir, mkdir and renames: the
        kernel sends a removed cgroupfs file's watch nothing. A cgroup that is gone meanwhile stays
        unwatched: the stream reports it removed."""
        if self._inotify is None:
            self._inotify = _Inotify()
            asyncio.get_running_loop().add_reader(self._inotify.fd, self._on_inotify)
        if name not in signals.parent_watched():
            self._watch_parent(self._inotify, signals, name, os.path.dirname(path))
        try:
            wd = self._inotify.add_watch(path)
        except AgentError as e:
            if e.errno == errno.ENOENT:
                return
            raise
        self._by_wd.setdefault(wd, set()).add(signals)
        signals.names_by_wd[wd] = name

    def _watch_parent(
        self, inotify: _Inotify, signals: KernelSignals, name: CgroupName, cgroup: str
    ) -> None:
        mask = PARENT_EVENTS | syscalls.IN_ONLYDIR
        try:
            wd = inotify.add_watch(os.path.dirname(cgroup), mask)
        except AgentError as e:
            if e.errno == errno.ENOENT:  # The parent is gone too: the interval finds it back.
                return
            raise
        self._parents_by_wd.setdefault(wd, set()).add(signals)
        signals.children_by_wd.setdefault(wd, {})[os.path.basename(cgroup)] = name

    def _subscribe_trigger(self, signals: KernelSignals, spec: PressureTriggerSpec) -> None:
        armed = self._triggers.get(spec)
        if armed is None:
            armed = self._arm(self.fs.proc("pressure", "memory"), spec)
            if armed is None:
                return
            self._triggers[spec] = armed
            asyncio.get_running_loop().add_reader(armed.epoll.fileno(), self._on_pressure, spec)
        armed.subscribers.add(signals)
        signals.trigger = spec

    def _arm(self, path: str, trigger: PressureTriggerSpec) -> _Trigger | None:
        try:
            fd = self.fs.open(path, os.O_RDWR | os.O_NONBLOCK)
        except AgentError as e:
            if e.errno == errno.ENOENT:
                return None  # No PSI in this kernel: the watch runs on its interval alone.
            raise
        # A PSI file always polls readable; the trigger is signalled as POLLPRI only,
        # so an epoll set listening for EPOLLPRI is what the event loop watches.
        try:
            epoll = select.epoll()
        except OSError as e:
            os.close(fd)
            raise kernel_error("open", "epoll", None, e) from None
        try:
            # Registering first refuses a file that cannot be polled (EPERM on a plain
            # file in a fake tree) before the trigger text is written into it.
            epoll.register(fd, select.EPOLLPRI)
            os.write(fd, trigger.line())
        except OSError as e:
            epoll.close()
            os.close(fd)
            repeats.warning(
                "pressure_trigger_unavailable", path=str(path), errno=e.errno, error=str(e)
            )
            return None
        return _Trigger(fd, epoll)

    def _on_inotify(self) -> None:
        if self._inotify is None:  # Closed while the callback was queued.
            return
        for wd, mask, entry in self._inotify.read_events():
            if wd in self._parents_by_wd:
                # A watched cgroup came or went: its stream reads a report at once.
                for signals in self._parents_by_wd[wd]:
                    name = signals.children_by_wd.get(wd, {}).get(entry)
                    if name is not None and mask & PARENT_EVENTS:
                        signals.queue.put_nowait((Signal.MEMORY_EVENTS, name))
                continue
            # IN_IGNORED: the kernel dropped the watch, its file gone (on cgroupfs only when
            # the inode goes, which may be long after the rmdir): only the books change here.
            gone = bool(mask & syscalls.IN_IGNORED)
            for signals in self._by_wd.pop(wd, set()) if gone else self._by_wd.get(wd, ()):
                name = signals.names_by_wd.pop(wd, None) if gone else signals.names_by_wd.get(wd)
                if name is not None:
                    signals.queue.put_nowait((Signal.MEMORY_EVENTS, name))

    def _on_pressure(self, spec: PressureTriggerSpec) -> None:
        armed = self._triggers.get(spec)
        if armed is None:  # Closed while the callback was queued.
            return
        if armed.epoll.poll(0):
            for signals in armed.subscribers:
                signals.queue.put_nowait((Signal.PRESSURE, None))

    def _release(
        self, by_wd: dict[int, set[KernelSignals]], signals: KernelSignals, wd: int
    ) -> None:
        """Take a stream off a watch (of memory.events, or of a parent); the last one removes it."""
        subscribers = by_wd.get(wd)
        if subscribers is None:
            return
        subscribers.discard(signals)
        if not subscribers:
            del by_wd[wd]
            if self._inotify is not None:
                self._inotify.remove_watch(wd)

    def forget(self, signals: KernelSignals, names: tuple[str, ...]) -> None:
        """Drop a stream's watches on cgroups found removed (in case no IN_IGNORED came), so
        it watches them afresh when they are back."""
        for wd, name in list(signals.names_by_wd.items()):
            if name in names:
                del signals.names_by_wd[wd]
                self._release(self._by_wd, signals, wd)

    def unsubscribe(self, signals: KernelSignals) -> None:
        self.watched -= len(signals.names)
        for wd in signals.names_by_wd:
            self._release(self._by_wd, signals, wd)
        signals.names_by_wd.clear()
        for wd in signals.children_by_wd:
            self._release(self._parents_by_wd, signals, wd)
        signals.children_by_wd.clear()
        if not self._by_wd and not self._parents_by_wd and self._inotify is not None:
            asyncio.get_running_loop().remove_reader(self._inotify.fd)
            self._inotify.close()
            self._inotify = None
        spec, signals.trigger = signals.trigger, None
        armed = self._triggers.get(spec) if spec is not None else None
        if armed is not None:
            armed.subscribers.discard(signals)
            if not armed.subscribers:
                del self._triggers[spec]  # type: ignore[arg-type]
                asyncio.get_running_loop().remove_reader(armed.epoll.fileno())
                armed.close()


class KernelSignals:
    """One stream's share of the hub: (Signal, cgroup name) on its own queue."""

    def __init__(self, hub: SignalHub, names: tuple[CgroupName, ...] = ()) -> None:
        self.hub = hub
        self.names = names  # The cgroups it watches, each counted against the caps.
        self.queue: asyncio.Queue[tuple[Signal, str | None]] = asyncio.Queue()
        self.names_by_wd: dict[int, CgroupName] = {}  # Those with a live watch.
        # Parent directory watch -> a cgroup's directory name in it -> the cgroup's name.
        self.children_by_wd: dict[int, dict[str, CgroupName]] = {}
        self.trigger: PressureTriggerSpec | None = None
        self._closed = False

    def parent_watched(self) -> set[str]:
        """Its cgroups whose parent directory it watches."""
        return {name for children in self.children_by_wd.values() for name in children.values()}

    def unwatched(self) -> tuple[CgroupName, ...]:
        """Its cgroups without a live watch: removed, and perhaps created again since."""
        live = set(self.names_by_wd.values())
        return tuple(name for name in self.names if name not in live)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.hub.unsubscribe(self)

    def __enter__(self) -> KernelSignals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
