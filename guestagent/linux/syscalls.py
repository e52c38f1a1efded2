"""The few system calls the standard library lacks, through ctypes, raising OSError."""

from __future__ import annotations

import ctypes
import functools
import os

IN_MODIFY = 0x00000002

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


def swapon(path: str, flags: int) -> None:
    _check(_libc().swapon(os.fsencode(path), ctypes.c_int(flags)), f"swapon({path})")


def swapoff(path: str) -> None:
    _check(_libc().swapoff(os.fsencode(path)), f"swapoff({path})")


def openat2(dirfd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    """openat(2) with resolution limits: ENOSYS before Linux 5.6, EXDEV/ELOOP on an escape."""
    how = _OpenHow(flags, mode, resolve)
    fd: int = _libc().syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(dirfd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        # The caller names the path and the operation; the error carries only the errno.
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd
