"""Domain errors. Modules raise these; the servicer maps each class to one gRPC code."""

import errno
import os


class AgentError(Exception):
    """Base class; the message is shown to the caller as the gRPC status details."""


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
    """A write failed midway; the error says what was restored."""


def errno_text(e: OSError) -> str:
    """'EBUSY (Device or resource busy)': the name to search for, and the words to read."""
    number = e.errno or 0
    name = errno.errorcode.get(number, f"errno {number}")
    return f"{name} ({e.strerror or os.strerror(number)})"
