"""SwapArea.rotational on the wire and on screen: unknown is neither 0 nor 1."""

from __future__ import annotations

import errno
import os

import grpc
import pytest

from guestagent.agent.rpc import status_for
from guestagent.agent.wire import swap_area_pb
from guestagent.errors import kernel_error
from guestagent.host.display import swap_area_text
from guestagent.ops.swap import DiscardPolicy, SwapArea


def area(rotational: bool | None) -> SwapArea:
    return SwapArea(
        "/dev/vdb", 1 << 30, 0, 10, DiscardPolicy.BOTH, True, rotational, "u", "guestagent-swap"
    )


@pytest.mark.parametrize(("rotational", "text"), [(False, "0"), (True, "1"), (None, "unknown")])
def test_rotational_is_sent_only_when_known(rotational: bool | None, text: str) -> None:
    message = swap_area_pb(area(rotational))
    assert message.HasField("rotational") == (rotational is not None)
    if rotational is not None:
        assert message.rotational is rotational
    assert f"rotational {text} " in swap_area_text(message)


@pytest.mark.parametrize(
    ("number", "code"),
    [
        (errno.EXDEV, grpc.StatusCode.INVALID_ARGUMENT),
        (errno.EBUSY, grpc.StatusCode.FAILED_PRECONDITION),
        (errno.EAGAIN, grpc.StatusCode.ABORTED),
        (errno.EIO, grpc.StatusCode.INTERNAL),
    ],
)
def test_kernel_errors_reach_the_caller_as_their_status(number: int, code: grpc.StatusCode) -> None:
    error = kernel_error(
        "write", "/proc/sys/vm/compact_memory", "1", OSError(number, os.strerror(number))
    )
    status, message = status_for(error)
    assert status == code
    assert "/proc/sys/vm/compact_memory" in message
