"""The few system calls the standard library lacks, through ctypes, raising OSError."""

from __future__ import annotations

import ctypes
import functools
import os

IN_MODIFY = 0x00000002


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
