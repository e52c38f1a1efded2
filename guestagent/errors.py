"""Domain errors. Modules raise these; the servicer maps each class to one gRPC code."""

from __future__ import annotations

import errno
import os


class AgentError(Exception):
    """Base class; the message is shown to the caller as the gRPC status details."""

    # The errno behind the error when a system call failed, for callers that decide on it
    # (EAGAIN from memory.reclaim is a partial result, ENOENT from a PSI file a missing feature).
    errno: int | None = None


class InvalidArgument(AgentError):
    """The request itself is wrong, whatever the guest's state."""


class NotFound(AgentError):
    """A named cgroup, device or node does not exist."""


class FailedPrecondition(AgentError):
    """The request is well formed but the guest's state refuses it (mounted disk, no feature)."""


class DeadlineExceeded(AgentError):
    """Something the request waits for did not happen in time."""


class KernelFormat(AgentError):
    """A kernel file did not have the format this agent knows: a bug or a new kernel."""


class Aborted(AgentError):
    """A write failed midway, or the kernel asked to try again; the error says what was restored."""


class ResourceExhausted(AgentError):
    """A limit was reached (a cap of this agent's, or the process's file descriptors): the
    message names it; the same call may succeed once others end."""


class Internal(AgentError):
    """The kernel failed in a way this agent does not expect (EIO, EFAULT): worth a bug report."""


# What an errno from a kernel file or system call means for the caller.
ERROR_BY_ERRNO: dict[int, type[AgentError]] = {
    # The path left its mount through '..' or a symlink (openat2's RESOLVE_BENEATH refusals).
    errno.EXDEV: InvalidArgument,
    errno.ELOOP: InvalidArgument,
    # The guest's state refuses the request: a missing file is a missing kernel feature.
    errno.ENOENT: FailedPrecondition,
    errno.ENOTDIR: FailedPrecondition,
    errno.EINVAL: FailedPrecondition,
    errno.EBUSY: FailedPrecondition,
    errno.EACCES: FailedPrecondition,
    errno.EPERM: FailedPrecondition,
    errno.ENOSPC: FailedPrecondition,
    # Transient: the same call may succeed when retried.
    errno.EAGAIN: Aborted,
    errno.EINTR: Aborted,
    errno.ENOMEM: Aborted,
    # Out of file descriptors (this process's, or the system's): a limit hit, not a bug.
    errno.EMFILE: ResourceExhausted,
    errno.ENFILE: ResourceExhausted,
}

# A value quoted back to the caller is cut to this many characters, so a hostile name of
# kilobytes does not come back whole in every message and log line.
QUOTE_MAX = 128


def quoted(value: str, limit: int = QUOTE_MAX) -> str:
    """repr() of value (control characters and NUL escaped), cut to `limit` characters."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def errno_text(e: OSError) -> str:
    """'EBUSY (Device or resource busy)': the name to search for, and the words to read."""
    number = e.errno or 0
    name = errno.errorcode.get(number, f"errno {number}")
    return f"{name} ({e.strerror or os.strerror(number)})"


def kernel_error(
    op: str, path: str | os.PathLike[str], value: str | None, error: OSError
) -> AgentError:
    """A domain error for a failed kernel file operation, naming the path, value and errno.

    'write '0' to /sys/block/vdb/queue/rotational: EINVAL (Invalid argument)'
    """
    target = f"{quoted(value)} to {os.fspath(path)}" if value is not None else os.fspath(path)
    message = f"{op} {target}: {errno_text(error)}"
    if error.errno in (errno.EXDEV, errno.ELOOP):
        message += "; refused: the path leads outside its mount, or through a forbidden link"
    result = ERROR_BY_ERRNO.get(error.errno or 0, Internal)(message)
    result.errno = error.errno
    return result
