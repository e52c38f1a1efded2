"""The few system calls the standard library lacks, through ctypes, raising OSError."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from typing import Any

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008  # A file opened for writing was closed: written whole.
# A directory's entry came or went: a cgroup's mkdir, rmdir or rename, seen on its parent.
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_ONLYDIR = 0x01000000
# The watch is gone: its file was removed (a cgroup's rmdir), or the watch was removed.
IN_IGNORED = 0x00008000
# mount(2) flags, from <linux/mount.h>.
MS_NOSUID = 0x2
MS_NODEV = 0x4

# <linux/openat2.h>; openat2 has the same number on every architecture (since Linux 5.6).
SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


_HOW_SIZE = ctypes.sizeof(_OpenHow)


@functools.cache
def _libc() -> ctypes.CDLL:
    # The running interpreter already links libc; CDLL(None) avoids find_library's subprocess.
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def inotify_init() -> int:
    return _check(_libc().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC), "inotify_init1")


def inotify_add_watch(fd: int, path: os.PathLike[str] | str, mask: int) -> int:
    return _check(
        _libc().inotify_add_watch(fd, os.fsencode(path), ctypes.c_uint32(mask)),
        f"inotify_add_watch({path})",
    )


def inotify_rm_watch(fd: int, wd: int) -> None:
    _check(_libc().inotify_rm_watch(fd, ctypes.c_int(wd)), "inotify_rm_watch")


def getrandom_into(buffer: bytearray) -> None:
    """Fill buffer from the kernel's CSPRNG in place: os.getrandom would return immutable
    bytes, which could not be wiped afterwards."""
    view = (ctypes.c_char * len(buffer)).from_buffer(buffer)
    filled = _check(_libc().getrandom(view, ctypes.c_size_t(len(buffer)), 0), "getrandom")
    if filled != len(buffer):  # Only reads over 256 bytes can come back short.
        raise OSError(0, f"getrandom: {filled} of {len(buffer)} bytes")


def ioctl_in_place(fd: int, request: int, buffer: bytearray, what: str) -> None:
    """ioctl(2) on buffer itself: fcntl.ioctl copies buffers under 1 KiB into one of its
    own, a copy that could not be wiped."""
    view = (ctypes.c_char * len(buffer)).from_buffer(buffer)
    _check(_libc().ioctl(fd, ctypes.c_ulong(request), view), what)


def swapon(path: str, flags: int) -> None:
    _check(_libc().swapon(os.fsencode(path), ctypes.c_int(flags)), f"swapon({path})")


def swapoff(path: str) -> None:
    _check(_libc().swapoff(os.fsencode(path)), f"swapoff({path})")


def mount(source: str, target: str, fstype: str, flags: int) -> None:
    _check(
        _libc().mount(
            os.fsencode(source),
            os.fsencode(target),
            os.fsencode(fstype),
            ctypes.c_ulong(flags),
            None,
        ),
        f"mount({target})",
    )


PR_SET_NAME = 15


def name_thread(name: str) -> None:
    """The calling thread's name in /proc/self/task/TID/comm (15 bytes kept), so its CPU
    can be told apart from the process's; best effort: a name is for measuring, not running."""
    with contextlib.suppress(OSError):
        _check(_libc().prctl(PR_SET_NAME, os.fsencode(name)[:15], 0, 0, 0), "prctl(PR_SET_NAME)")


# <asm-generic/resource.h>, which x86_64 and arm64 use.
RLIMIT_NOFILE = 7


class _Rlimit(ctypes.Structure):
    # rlim_t is an unsigned long on both 64-bit ABIs the agent runs on.
    _fields_ = [("soft", ctypes.c_ulong), ("hard", ctypes.c_ulong)]


def nofile_limits() -> tuple[int, int]:
    """RLIMIT_NOFILE's (soft, hard), as resource.getrlimit gives them (never infinite: the
    kernel caps it at fs.nr_open). Through the ctypes the agent loads anyway: resource is an
    extension module, 32 KiB of every guest's RSS for two calls at start."""
    limit = _Rlimit()
    _check(_libc().getrlimit(RLIMIT_NOFILE, ctypes.byref(limit)), "getrlimit(RLIMIT_NOFILE)")
    return limit.soft, limit.hard


def set_nofile_limits(soft: int, hard: int) -> None:
    limit = _Rlimit(soft, hard)
    _check(_libc().setrlimit(RLIMIT_NOFILE, ctypes.byref(limit)), "setrlimit(RLIMIT_NOFILE)")


# <malloc.h>: mallopt's parameter for the number of malloc arenas.
M_ARENA_MAX = -8


def limit_malloc_arenas(count: int) -> bool:
    """Cap glibc's malloc arenas (mallopt M_ARENA_MAX), as MALLOC_ARENA_MAX would. glibc gives
    each new thread an arena of its own, up to 8 per core, and an arena keeps the memory it
    once held: grpc's threads under a burst of connections leave RSS behind that way. Call it
    before threads start. False where the libc has no such parameter (musl) or refuses."""
    mallopt = getattr(_libc(), "mallopt", None)
    return mallopt is not None and mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(count)) == 1


PR_SET_THP_DISABLE = 41
PR_GET_THP_DISABLE = 42


def refuse_huge_pages() -> bool:
    """Keep transparent huge pages out of this process (prctl PR_SET_THP_DISABLE): where the
    kernel's THP is "always", the first touch of a 2 MiB-aligned stretch of an anonymous
    mapping (glibc's 64 MiB-aligned arena heaps, thread stacks) can take a whole 2 MiB page
    for a few KiB in use; an agent that uses little of each mapping pays for all of it.
    Inherited by children; affects faults from now on. False where the kernel refuses."""
    return bool(_libc().prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0)


def huge_pages_refused() -> bool:
    return bool(_libc().prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1)


# mlockall(2) flags, <sys/mman.h>: what is mapped now, what is mapped later, each page locked
# as it is faulted in (Linux 4.4) rather than all at once.
MCL_CURRENT, MCL_FUTURE, MCL_ONFAULT = 1, 2, 4
_LOCK_ALL = MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT
_memory_locked = False


def lock_memory() -> None:
    """Keep every page this process has, and every one it faults in later, out of reclaim and
    swap (mlockall, as earlyoom locks itself): a page is locked as it is touched, so what is
    never touched costs nothing. OSError: EPERM without CAP_IPC_LOCK over RLIMIT_MEMLOCK."""
    global _memory_locked
    _check(_libc().mlockall(ctypes.c_int(_LOCK_ALL)), "mlockall")
    _memory_locked = True


def give_heap_back() -> bool:
    """Return free heap to the kernel (glibc's malloc_trim(0)): free(3) keeps what it frees
    for reuse, in every arena, and only the top of the main heap goes back on its own. False
    where the libc has no malloc_trim (musl) or nothing could be released. Locked memory is
    unlocked for it: the trim's madvise(MADV_DONTNEED) refuses locked pages (EINVAL)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    if not _memory_locked:
        return bool(trim(ctypes.c_size_t(0)) == 1)
    _libc().munlockall()
    try:
        return bool(trim(ctypes.c_size_t(0)) == 1)
    finally:
        _libc().mlockall(ctypes.c_int(_LOCK_ALL))


def umount(target: str) -> None:
    _check(_libc().umount2(os.fsencode(target), ctypes.c_int(0)), f"umount({target})")


@functools.cache
def _openat2_syscall() -> Any:
    # Declared once, so every argument reaches syscall(2) as the width the kernel reads.
    function = _libc()["syscall"]
    function.argtypes = [
        ctypes.c_long,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.POINTER(_OpenHow),
        ctypes.c_size_t,
    ]
    function.restype = ctypes.c_long
    return function


@functools.cache
def _open_how(flags: int, mode: int, resolve: int) -> _OpenHow:
    # A handful of distinct combinations are used; building the struct each time costs more
    # than the system call.
    return _OpenHow(flags, mode, resolve)


def openat2(dirfd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    """openat(2) with resolution limits: ENOSYS before Linux 5.6, EXDEV/ELOOP on an escape."""
    how = _open_how(flags, mode, resolve)
    fd: int = _openat2_syscall()(SYS_OPENAT2, dirfd, os.fsencode(path), how, _HOW_SIZE)
    if fd < 0:
        # The caller names the path and the operation; the error carries only the errno.
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd
