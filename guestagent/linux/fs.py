"""The one place that knows where the kernel's files are, and the one way to touch them.

Production uses root "/"; unit tests point it at a fake tree under a temp dir, so every
module reads and writes kernel files through a KernelFS and none hard-codes /proc or /sys.

Every open happens beneath the mount the path belongs to (/proc, /sys, /dev, /run, and the
cgroup2 mount), with openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS), as runc does: a
cgroup path chosen by a container cannot lead the agent out through '..', a symlink or a
/proc magic link, and no check-then-open race is left. cgroupfs never holds symlinks, so
there any symlink is refused outright. Kernels before 5.6 lack openat2; there the resolved
path is checked before the open instead.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

from guestagent.errors import (
    QUOTE_MAX,
    AgentError,
    InvalidArgument,
    KernelFormat,
    kernel_error,
    quoted,
)
from guestagent.linux import syscalls
from guestagent.records import record

_BENEATH = syscalls.RESOLVE_BENEATH | syscalls.RESOLVE_NO_MAGICLINKS
_DIRECTORY = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
# openat2 answers EAGAIN when a concurrent rename may have let '..' escape; the man page
# invites a retry, and a few suffice unless someone keeps renaming on purpose.
_OPENAT2_TRIES = 3


Parsed = TypeVar("Parsed")


def parsed(path: str, text: str, parse: Callable[[str], Parsed]) -> Parsed:
    """A kernel file's text parsed; a value the parser does not know (its KernelFormat, or
    int()'s ValueError) is a KernelFormat naming the file and the text, so the caller hears
    where, not a Python exception's name."""
    try:
        return parse(text)
    except (KernelFormat, ValueError) as e:
        # A parser's own error quotes the line; int()'s names only Python's view of it.
        why = str(e) if isinstance(e, KernelFormat) else "not the format this agent knows"
        raise KernelFormat(
            f"{path} holds {quoted(text.strip())}: {why}",
            "KERNEL_FORMAT",
            metadata={"path": path, "value": text[:QUOTE_MAX]},
        ) from e


@functools.cache
def have_openat2() -> bool:
    try:
        os.close(syscalls.openat2(-100, "/", os.O_PATH | os.O_CLOEXEC, 0))  # AT_FDCWD
    except OSError as e:
        if e.errno == errno.ENOSYS:
            return False
        raise
    return True


@record
class KernelFS:
    # Paths are strings, joined with os.path: pathlib, with the urllib.parse it imports, is
    # about 0.3 MiB of every guest's memory (docs/measurements.md, 2026-12-07). A test may
    # give a Path as root; every path handed out is a str.
    root: str | os.PathLike[str] = "/"
    # Where cgroup2 is mounted, relative to root.
    cgroup_mount: str = "sys/fs/cgroup"

    def proc(self, *parts: str) -> str:
        return os.path.join(self.root, "proc", *parts)

    def sys(self, *parts: str) -> str:
        return os.path.join(self.root, "sys", *parts)

    def dev(self, *parts: str) -> str:
        return os.path.join(self.root, "dev", *parts)

    def run(self, *parts: str) -> str:
        """/run: a tmpfs that outlives an agent restart but not a reboot, as kernel state does."""
        return os.path.join(self.root, "run", *parts)

    @property
    def cgroup_root(self) -> str:
        return os.path.join(self.root, self.cgroup_mount)

    @property
    def is_real(self) -> bool:
        """True when this is the live kernel, where syscalls (swapon) match the files."""
        return os.path.realpath(self.root) == "/"

    def host_path(self, kernel_path: str | os.PathLike[str]) -> str:
        """Map an absolute path as the kernel names it (/dev/vdb) into this tree."""
        return os.path.join(self.root, os.fspath(kernel_path).lstrip("/"))

    @functools.cached_property
    def _mounts(self) -> tuple[tuple[str, str, int], ...]:
        """(mount, mount + '/', openat2 resolve flags); the prefix is what a path beneath the
        mount starts with."""
        mounts = (
            # First: it lies inside /sys, and is stricter.
            (self.cgroup_root, _BENEATH | syscalls.RESOLVE_NO_SYMLINKS),
            (self.proc(), _BENEATH),
            (self.sys(), _BENEATH),
            (self.dev(), _BENEATH),
            (self.run(), _BENEATH),
        )
        return tuple((base, os.path.join(base, ""), resolve) for base, resolve in mounts)

    def _mount_of(self, path: str) -> tuple[str, str, int]:
        """The mount a path lies in, the path relative to it, and the openat2 resolve flags."""
        text = os.fspath(path)
        for base, prefix, resolve in self._mounts:
            if text.startswith(prefix):
                return base, text[len(prefix) :], resolve
            if text == base:
                return base, ".", resolve
        raise InvalidArgument(
            f"{path} is in none of the kernel's mounts under {self.root}",
            "PATH_OUTSIDE_MOUNT",
            metadata={"path": path},
        )

    def open(self, path: str, flags: int, op: str = "open", value: str | None = None) -> int:
        """A file descriptor (always O_CLOEXEC) for a path opened beneath its mount.

        Any failure is the domain error for its errno (kernel_error), naming op, path and
        value; an escape from the mount is InvalidArgument.
        """
        base, relative, resolve = self._mount_of(path)
        flags |= os.O_CLOEXEC
        try:
            if not have_openat2():
                return _open_checked(path, base, relative, resolve, flags)
            return _open_beneath(base, relative, flags, resolve)
        except OSError as e:
            raise kernel_error(op, path, value, e) from e

    def read_bytes(self, path: str) -> bytes:
        fd = self.open(path, os.O_RDONLY, "read")
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        except OSError as e:
            raise kernel_error("read", path, None, e) from e
        finally:
            os.close(fd)
        return b"".join(chunks)

    def read(self, path: str) -> str:
        # os-level calls: kernel files are small, and a text-mode file object costs several
        # times the read itself on the memory report's hot path.
        return self.read_bytes(path).decode("ascii", errors="replace")

    def read_parsed(self, path: str, parse: Callable[[str], Parsed]) -> Parsed:
        return parsed(path, self.read(path), parse)

    def read_int(self, path: str) -> int:
        """A file that holds one decimal number (memory.current, a block device's size)."""
        return parsed(path, self.read(path), int)

    def read_optional(self, path: str) -> str | None:
        """Read a file whose absence means a kernel feature is off (PSI, swap accounting)."""
        try:
            return self.read(path)
        except AgentError as e:
            if e.errno == errno.ENOENT:
                return None
            raise

    def write(self, path: str, value: str) -> None:
        """Write one value with one write(2), since the kernel parses each write as a whole value.

        O_TRUNC is what a shell's '>' passes: kernfs ignores the size change, and it empties the
        regular files of a test tree. There is no O_CREAT: a missing file is a missing kernel
        feature, never something to create. EAGAIN is not retried: from memory.reclaim it is
        the kernel's answer, not a race.
        """
        data = value.encode("ascii")
        fd = self.open(path, os.O_WRONLY | os.O_TRUNC, "write", value)
        with _closing(fd, "write", path, value):
            written = os.write(fd, data)
        if written != len(data):
            short = OSError(errno.EIO, f"short write, {written} of {len(data)} bytes")
            raise kernel_error("write", path, value, short)

    def _probe(self, path: str, flags: int, absent: tuple[int, ...]) -> bool:
        try:
            os.close(self.open(path, flags, "look up"))
        except AgentError as e:
            if e.errno in absent:
                return False
            raise
        return True

    def exists(self, path: str) -> bool:
        return self._probe(path, os.O_PATH, (errno.ENOENT, errno.ENOTDIR))

    def is_dir(self, path: str) -> bool:
        return self._probe(path, _DIRECTORY, (errno.ENOENT, errno.ENOTDIR))

    def listdir(self, path: str) -> list[str]:
        fd = self.open(path, os.O_RDONLY | os.O_DIRECTORY, "list")
        with _closing(fd, "list", path):
            return sorted(os.listdir(fd))

    def subdirectories(self, path: str) -> list[str]:
        """The directories in a directory (a cgroup's children), without a look-up each."""
        fd = self.open(path, os.O_RDONLY | os.O_DIRECTORY, "list")
        with _closing(fd, "list", path), os.scandir(fd) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        parent, name = os.path.split(path)
        parent_fd = self.open(parent, _DIRECTORY, "look up")
        with _closing(parent_fd, "make directory", path):
            os.mkdir(name, mode, dir_fd=parent_fd)

    def rmdir(self, path: str) -> None:
        parent, name = os.path.split(path)
        parent_fd = self.open(parent, _DIRECTORY, "look up")
        with _closing(parent_fd, "remove directory", path):
            os.rmdir(name, dir_fd=parent_fd)


@contextlib.contextmanager
def _closing(fd: int, op: str, path: str, value: str | None = None) -> Iterator[None]:
    """Close fd after the block; an OSError in it is the domain error for op (kernel_error)."""
    try:
        yield
    except OSError as e:
        raise kernel_error(op, path, value, e) from e
    finally:
        os.close(fd)


def _open_beneath(base: str, relative: str, flags: int, resolve: int) -> int:
    directory = os.open(base, _DIRECTORY)
    try:
        for _ in range(_OPENAT2_TRIES - 1):
            with contextlib.suppress(BlockingIOError):
                return syscalls.openat2(directory, relative, flags, resolve)
        return syscalls.openat2(directory, relative, flags, resolve)
    finally:
        os.close(directory)


def _open_checked(path: str, base: str, relative: str, resolve: int, flags: int) -> int:
    """The pre-openat2 fallback: resolve, check, then open (racy against a rename meanwhile)."""
    real_base = os.path.realpath(base)
    real = os.path.realpath(path)
    if os.path.commonpath([real, real_base]) != real_base:
        raise OSError(errno.EXDEV, f"it resolves to {real}, outside {real_base}")
    if resolve & syscalls.RESOLVE_NO_SYMLINKS and real != os.path.normpath(
        os.path.join(real_base, relative)
    ):
        raise OSError(errno.ELOOP, f"it crosses a symlink, to {real}")
    return os.open(path, flags)
