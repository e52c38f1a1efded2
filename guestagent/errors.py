"""Domain errors. Modules raise these; the servicer maps each class to one gRPC code.

Each refusal also carries a stable machine-readable `reason` (the richer error model's
ErrorInfo.reason), values naming what it is about (`metadata`), and for a bad request the
request field at fault: a client in any language acts on the reason, never the message text.
REASONS is the one table of reasons and their classes; docs/contract.md lists it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping

# ErrorInfo.domain of every refusal: the reasons (REASONS) are this agent's own.
ERROR_DOMAIN = "guestagent"


class AgentError(Exception):
    """Base class; the message is shown to the caller as the gRPC status details."""

    # The errno behind the error when a system call failed, for callers that decide on it
    # (EAGAIN from memory.reclaim is a partial result, ENOENT from a PSI file a missing feature).
    errno: int | None = None
    # The reason a refusal of this class has when its raiser names none.
    default_reason = "AGENT_ERROR"

    def __init__(
        self,
        message: str,
        reason: str | None = None,
        *,
        field: str = "",
        metadata: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason or self.default_reason
        # The request field at fault, e.g. "interval_ms": sent (BadRequest.FieldViolation)
        # with INVALID_ARGUMENT only, whose refusals are about the request.
        self.field = field
        self.metadata = {key: str(value) for key, value in (metadata or {}).items()}

    def reworded(self, message: str) -> AgentError:
        """The same refusal (class, reason, field, metadata, errno) with a longer message."""
        copy = type(self)(message, self.reason, field=self.field, metadata=self.metadata)
        copy.errno = self.errno
        return copy


class InvalidArgument(AgentError):
    """The request itself is wrong, whatever the guest's state."""

    default_reason = "INVALID_REQUEST"


class NotFound(AgentError):
    """A named cgroup, device or node does not exist."""

    default_reason = "NOT_FOUND"


class FailedPrecondition(AgentError):
    """The request is well formed but the guest's state refuses it (mounted disk, no feature)."""

    default_reason = "KERNEL_REFUSED"


class DeadlineExceeded(AgentError):
    """Something the request waits for did not happen in time."""

    default_reason = "TIMED_OUT"


class KernelFormat(AgentError):
    """A kernel file did not have the format this agent knows: a bug or a new kernel."""

    default_reason = "KERNEL_FORMAT"


class Aborted(AgentError):
    """A write failed midway, or the kernel asked to try again; the error says what was restored."""

    default_reason = "KERNEL_RETRY"


class ResourceExhausted(AgentError):
    """A limit was reached (a cap of this agent's, or the process's file descriptors): the
    message names it; the same call may succeed once others end."""

    default_reason = "FILE_DESCRIPTORS_EXHAUSTED"


class Unavailable(AgentError):
    """The agent is stopping: the same call may succeed against the agent that follows."""

    default_reason = "AGENT_STOPPING"


class Internal(AgentError):
    """The kernel failed in a way this agent does not expect (EIO, EFAULT): worth a bug report."""

    default_reason = "KERNEL_FAILED"


def caused_by(error: BaseException) -> dict[str, str]:
    """Metadata for a refusal that wraps another: the wrapped one's reason and values."""
    if isinstance(error, AgentError):
        return {**error.metadata, "cause": error.reason}
    return {"cause": type(error).__name__}


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

# The reasons of kernel_error's refusals, where the class's default is not the right one.
REASON_BY_ERRNO: dict[int, str] = {
    errno.EXDEV: "PATH_OUTSIDE_MOUNT",
    errno.ELOOP: "PATH_OUTSIDE_MOUNT",
    errno.ENOENT: "KERNEL_FILE_MISSING",
    errno.ENOTDIR: "KERNEL_FILE_MISSING",
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
    number = error.errno or 0
    cls = ERROR_BY_ERRNO.get(number, Internal)
    metadata = {"op": op, "path": os.fspath(path), "errno": errno.errorcode.get(number, number)}
    if value is not None:
        metadata["value"] = value[:QUOTE_MAX]
    result = cls(message, REASON_BY_ERRNO.get(number), metadata=metadata)
    result.errno = error.errno
    return result


# Every refusal's reason, the class (so the status code) it always comes with, and what it
# means. A client acts on the reason; docs/contract.md lists this table, and a unit test
# checks that each raise names a reason from it with its class.
REASONS: dict[str, tuple[type[AgentError], str]] = {
    # The request itself.
    "INVALID_REQUEST": (InvalidArgument, "a request value outside what the call takes"),
    "CGROUP_PATH_INVALID": (InvalidArgument, "a cgroup path that is empty, absolute, has '..'"),
    "CGROUP_V1_SETTING": (InvalidArgument, "kernel, kernel_tcp, swappiness or the OOM killer"),
    "DEVICE_INVALID": (InvalidArgument, "no device, or a path not under /dev, a bad serial"),
    "DROP_CACHES_INVALID": (InvalidArgument, "drop_caches not 0..3"),
    "ENUM_VALUE_UNKNOWN": (InvalidArgument, "an enum value this agent does not know"),
    "IDLE_EDGES_INVALID": (InvalidArgument, "idle_edges_ms too many, 0, or not ascending"),
    "LIMIT_VALUE_INVALID": (InvalidArgument, "a limit neither bytes nor -1, or over int64"),
    "NODE_INVALID": (InvalidArgument, "a negative NUMA node"),
    "PATH_OUTSIDE_MOUNT": (InvalidArgument, "a path that leads out of its mount ('..', link)"),
    "PRESSURE_TRIGGER_INVALID": (InvalidArgument, "a window outside 0.5..10 s, stall >= window"),
    "RECLAIM_POLICY_INVALID": (InvalidArgument, "a reclaim policy field outside its range"),
    "RECLAIM_SIZE_INVALID": (InvalidArgument, "a reclaim size that is not positive"),
    "SWAP_LABEL_TOO_LONG": (InvalidArgument, "a swap label over 16 bytes"),
    "SWAP_PRIORITY_INVALID": (InvalidArgument, "a swap priority outside 0..32767"),
    "SWAP_TOTAL_BELOW_LIMIT": (InvalidArgument, "memory+swap total below the memory limit"),
    "SWAP_TOTAL_WITHOUT_LIMIT": (InvalidArgument, "a memory+swap total with no memory limit"),
    "TOO_MANY_NAMES": (InvalidArgument, "over 1024 cgroup names in one request"),
    "WATCH_INTERVAL_TOO_SHORT": (InvalidArgument, "a watch interval below 100 ms"),
    "WATCH_TOO_MANY_CGROUPS": (
        InvalidArgument,
        "over 256 cgroups in one stream, or over 1024 cgroup reads a second",
    ),
    # Something named that is not there.
    "NOT_FOUND": (NotFound, "a named thing that does not exist"),
    "CGROUP_NOT_FOUND": (NotFound, "a cgroup that does not exist (and create not set)"),
    "DEVICE_NOT_FOUND": (NotFound, "no block device with that path or serial"),
    "NODE_NOT_FOUND": (NotFound, "a NUMA node the guest does not have"),
    "NO_RECLAIM_POLICY": (NotFound, "a cgroup the reclaimer has no policy for"),
    "SWAP_NOT_ACTIVE": (NotFound, "a device that is not an active swap area"),
    # The guest's state refuses the request.
    "KERNEL_REFUSED": (FailedPrecondition, "the kernel refused a write: EINVAL, EBUSY, EPERM"),
    "KERNEL_FILE_MISSING": (FailedPrecondition, "a kernel file is missing: a feature is off"),
    "CLEAR_SWAP_IN_CONFIDENTIAL_GUEST": (FailedPrecondition, "NONE in a confidential guest"),
    "COMPACTION_ABSENT": (FailedPrecondition, "no CONFIG_COMPACTION"),
    "DEVICE_HOLDS_DATA": (FailedPrecondition, "a filesystem, partitions or data on the disk"),
    "DEVICE_IN_USE": (FailedPrecondition, "the disk is mounted, held, or open elsewhere"),
    "DEVICE_STAYS_ROTATIONAL": (FailedPrecondition, "queue/rotational will not go to 0"),
    "DEVICE_UNREADABLE": (FailedPrecondition, "the disk cannot be read to check it is blank"),
    "DEVICE_UNSUITABLE": (FailedPrecondition, "not a whole block disk, or too small for swap"),
    "ENCRYPTION_UNAVAILABLE": (FailedPrecondition, "no device-mapper or dm-crypt in the kernel"),
    "LIMIT_FILE_MISSING": (FailedPrecondition, "memory.max is there but memory.low is not"),
    "MAPPING_NOT_REMOVED": (FailedPrecondition, "swap is off but its dm-crypt mapping stays"),
    "MEMORY_CONTROLLER_OFF": (FailedPrecondition, "the cgroup's parent does not enable memory"),
    "MEMORY_RECLAIM_ABSENT": (FailedPrecondition, "no memory.reclaim (Linux 5.19+)"),
    "NOT_A_CGROUP": (FailedPrecondition, "a path level is a file, or not cgroup v2"),
    "NO_ACTIVE_SWAP": (FailedPrecondition, "anon reclaim asked with no active swap area"),
    "ONLINE_MEMORY_OFF": (FailedPrecondition, "the agent runs with --online-memory off"),
    "STALL_SIGNAL_ABSENT": (FailedPrecondition, "neither PSI nor delay accounting"),
    "FULL_STALL_NEEDS_PSI": (FailedPrecondition, "a `full` pressure trigger without PSI"),
    "STATE_UNUSABLE": (FailedPrecondition, "a state file or directory that is not ours"),
    "STATE_UNWRITABLE": (FailedPrecondition, "the limits journal cannot be written first"),
    "SWAPOFF_FAILED": (FailedPrecondition, "swapoff failed (ENOMEM: swapped pages do not fit)"),
    "SWAP_ACCOUNTING_ABSENT": (FailedPrecondition, "swap bytes asked, no memory.swap.max"),
    "SWAP_ACTIVE_OTHERWISE": (FailedPrecondition, "active swap with the other encryption"),
    "SWAP_NOT_LISTED": (FailedPrecondition, "swapon succeeded, /proc/swaps does not list it"),
    "SWAP_UNSUPPORTED": (FailedPrecondition, "no /proc/swaps: a kernel without swap"),
    "TOOL_MISSING": (FailedPrecondition, "mkswap (or another tool) is not installed"),
    "UDEV_UNAVAILABLE": (FailedPrecondition, "no udev over a test tree"),
    # Waited for, did not happen.
    "TIMED_OUT": (DeadlineExceeded, "something waited for did not happen in time"),
    "COMPACTION_STILL_RUNNING": (DeadlineExceeded, "compaction outlasted the deadline"),
    "DEVICE_WAIT_TIMED_OUT": (DeadlineExceeded, "the disk did not appear within wait_ms"),
    # Failed midway, restored; the same call may succeed again.
    "KERNEL_RETRY": (Aborted, "EAGAIN, EINTR or ENOMEM from the kernel"),
    "CGROUP_CREATE_FAILED": (Aborted, "creating the cgroup failed; what was made is removed"),
    "LIMIT_CHANGED_MEANWHILE": (Aborted, "a limit file read back other than written"),
    "LIMIT_WRITE_FAILED": (Aborted, "a limit write failed; the old values are back"),
    "SWAP_ENABLE_FAILED": (Aborted, "mkswap or swapon failed; the disk is as it was"),
    # Caps.
    "FILE_DESCRIPTORS_EXHAUSTED": (ResourceExhausted, "EMFILE or ENFILE"),
    "INOTIFY_WATCHES_EXHAUSTED": (ResourceExhausted, "fs.inotify.max_user_watches reached"),
    "WATCHES_EXHAUSTED": (ResourceExhausted, "the agent's --max-watches are all in use"),
    # Stopping: the same call may succeed against the agent that follows.
    "AGENT_STOPPING": (Unavailable, "a call that would start the reclaimer as the agent stops"),
    # Worth a bug report.
    "KERNEL_FORMAT": (KernelFormat, "a kernel file this agent cannot parse (file and value)"),
    "KERNEL_FAILED": (Internal, "EIO, EFAULT or another errno the agent does not expect"),
    "AGENT_ERROR": (AgentError, "an error of this agent's without a reason of its own"),
    # At start only, never over RPC: why the daemon did not come up.
    "ADDRESS_IN_USE": (AgentError, "another agent listens on the address"),
    "ADDRESS_NOT_A_SOCKET": (InvalidArgument, "a file that is not a socket at a unix address"),
    "ADDRESS_UNAVAILABLE": (FailedPrecondition, "gRPC could not bind the address"),
    "OPTION_INVALID": (InvalidArgument, "a command-line option's value"),
}
