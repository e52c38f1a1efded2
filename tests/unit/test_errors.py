"""Errno to domain error: what a failed kernel call means for the caller."""

from __future__ import annotations

import errno
import os

import pytest

from guestagent.errors import (
    ERROR_BY_ERRNO,
    Aborted,
    AgentError,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    kernel_error,
)


@pytest.mark.parametrize(
    ("number", "expected"),
    [
        (errno.EXDEV, InvalidArgument),
        (errno.ELOOP, InvalidArgument),
        (errno.ENOENT, FailedPrecondition),
        (errno.ENOTDIR, FailedPrecondition),
        (errno.EINVAL, FailedPrecondition),
        (errno.EBUSY, FailedPrecondition),
        (errno.EACCES, FailedPrecondition),
        (errno.EPERM, FailedPrecondition),
        (errno.ENOSPC, FailedPrecondition),
        (errno.EAGAIN, Aborted),
        (errno.EINTR, Aborted),
        (errno.ENOMEM, Aborted),
        (errno.EIO, Internal),
        (errno.EFAULT, Internal),
    ],
)
def test_errno_table(number: int, expected: type[AgentError]) -> None:
    error = kernel_error("write", "/sys/x", "1", OSError(number, os.strerror(number)))
    assert type(error) is expected
    assert error.errno == number
    assert ERROR_BY_ERRNO.get(number, Internal) is expected


def test_message_names_operation_value_path_and_errno() -> None:
    error = kernel_error(
        "write", "/sys/block/vdb/queue/rotational", "0", OSError(errno.EINVAL, "Invalid argument")
    )
    assert str(error) == "write '0' to /sys/block/vdb/queue/rotational: EINVAL (Invalid argument)"
    assert str(kernel_error("read", "/proc/x", None, OSError(errno.EIO, "I/O error"))) == (
        "read /proc/x: EIO (I/O error)"
    )


def test_an_escape_says_so() -> None:
    error = kernel_error(
        "read", "/sys/../etc/passwd", None, OSError(errno.EXDEV, "Invalid cross-device link")
    )
    assert "outside its mount" in str(error)


def test_no_errno_is_internal() -> None:
    assert type(kernel_error("read", "/proc/x", None, OSError("no errno"))) is Internal
