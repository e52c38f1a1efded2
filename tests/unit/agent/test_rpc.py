"""The servicer's shared behaviour: one status table, INTERNAL for bugs, an audit line for
each state-changing call (success or refusal) with the caller the relay saw."""

from __future__ import annotations

import errno
import logging
import os
import socket
from typing import Any, NoReturn

import grpc
import pytest

from guestagent import errors
from guestagent.agent.rpc import STATUS_BY_ERROR, MemoryAgentServicer, status_for
from guestagent.errors import kernel_error
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.root import FakeRoot
from tests.fakes.servicer import Aborted, FakeContext, make_servicer, memory_info


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.InvalidArgument("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.NotFound("x"), grpc.StatusCode.NOT_FOUND),
        (errors.FailedPrecondition("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.DeadlineExceeded("x"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (errors.Aborted("x"), grpc.StatusCode.ABORTED),
        (errors.KernelFormat("x"), grpc.StatusCode.INTERNAL),
        (errors.AgentError("x"), grpc.StatusCode.INTERNAL),
    ],
)
def test_status_table(error: errors.AgentError, code: grpc.StatusCode) -> None:
    assert status_for(error) == (code, "x")


def test_a_subclass_takes_its_parents_code() -> None:
    class DiskBusy(errors.FailedPrecondition):
        pass

    assert status_for(DiskBusy("/dev/vdb is mounted")) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "/dev/vdb is mounted",
    )


def test_every_domain_error_has_a_row() -> None:
    leaves = {cls for cls in vars(errors).values() if isinstance(cls, type)}
    assert {c for c in leaves if issubclass(c, errors.AgentError)} - {errors.AgentError} == set(
        STATUS_BY_ERROR
    )


def test_a_bug_is_internal_with_its_type() -> None:
    assert status_for(KeyError("memory.max")) == (
        grpc.StatusCode.INTERNAL,
        "KeyError: 'memory.max'",
    )


@pytest.fixture
def servicer(fake_root: FakeRoot) -> MemoryAgentServicer:
    fake_root.add_cgroup("pod")
    return make_servicer(fake_root)


def audit_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [
        dict(getattr(r, "fields", {}))
        for r in caplog.records
        if r.name == "guestagent.audit" and r.getMessage() == "audit"
    ]


async def test_a_refusal_is_aborted_and_audited(
    servicer: MemoryAgentServicer, caplog: pytest.LogCaptureFixture
) -> None:
    context: Any = FakeContext()
    with caplog.at_level(logging.INFO), pytest.raises(Aborted):
        await servicer.Reclaim(pb.ReclaimRequest(cgroup="pod", bytes=-5), context)
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "-5" in context.details
    (line,) = audit_lines(caplog)
    assert line["method"] == "Reclaim"
    assert line["peer"] == "ipv4:127.0.0.1:40000"
    assert line["request"] == {"cgroup": "pod", "bytes": -5}
    assert line["code"] == "INVALID_ARGUMENT"
    assert "-5" in str(line["error"])
    assert isinstance(line["duration_ms"], float)


async def test_a_success_is_audited_with_the_relayed_caller(
    servicer: MemoryAgentServicer, caplog: pytest.LogCaptureFixture, tmp_path: object
) -> None:
    listener = socket.socket(socket.AF_UNIX)
    path = f"{tmp_path}/upstream.sock"
    listener.bind(path)
    listener.listen()
    sock, name = servicer.peers.bind("vsock:2:50123")
    sock.connect(path)
    try:
        context: Any = FakeContext(peer=f"unix-abstract:{name}")
        with caplog.at_level(logging.INFO):
            result = await servicer.SetMemoryLimits(
                pb.SetMemoryLimitsRequest(cgroup="pod", memory=pb.LinuxMemory(limit=64 << 20)),
                context,
            )
    finally:
        sock.close()
        listener.close()
    assert result.memory_max == str(64 << 20)
    (line,) = audit_lines(caplog)
    assert line["method"] == "SetMemoryLimits"
    assert line["peer"] == "vsock:2:50123"
    assert line["request"] == {"cgroup": "pod", "memory": {"limit": 64 << 20}}
    assert line["code"] == "OK" and "error" not in line


async def test_enums_are_audited_by_name(
    servicer: MemoryAgentServicer, caplog: pytest.LogCaptureFixture
) -> None:
    request = pb.EnableSwapRequest(
        device=pb.DeviceSelector(path="/etc/x"), discard=pb.DISCARD_PAGES
    )
    with caplog.at_level(logging.INFO), pytest.raises(Aborted):
        await servicer.EnableSwap(request, FakeContext())  # type: ignore[arg-type]
    (line,) = audit_lines(caplog)
    assert line["request"] == {"device": {"path": "/etc/x"}, "discard": "DISCARD_PAGES"}


async def test_reads_are_not_audited(
    servicer: MemoryAgentServicer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        context: Any = FakeContext()
        info = await memory_info(servicer, pb.GetMemoryInfoRequest(cgroups=["pod"]), context)
    assert info.cgroups[0].path == "pod"
    assert audit_lines(caplog) == []


async def test_a_bug_is_internal_and_logged(
    servicer: MemoryAgentServicer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: object) -> NoReturn:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("guestagent.ops.info.read_system", broken)
    context: Any = FakeContext()
    with caplog.at_level(logging.INFO), pytest.raises(Aborted):
        await memory_info(servicer, pb.GetMemoryInfoRequest(), context)
    assert (context.code, context.details) == (
        grpc.StatusCode.INTERNAL,
        "ZeroDivisionError: division by zero",
    )
    (failure,) = [r for r in caplog.records if r.getMessage() == "rpc_failed"]
    assert failure.exc_info is not None


async def test_a_failed_write_is_audited_as_aborted(
    servicer: MemoryAgentServicer,
    fake_root: FakeRoot,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake_root.kernel.fail("write", "memory.max", errno.EBUSY)
    context: Any = FakeContext()
    request = pb.SetMemoryLimitsRequest(cgroup="pod", memory=pb.LinuxMemory(limit=1 << 30))
    with caplog.at_level(logging.INFO), pytest.raises(Aborted):
        await servicer.SetMemoryLimits(request, context)
    (line,) = audit_lines(caplog)
    assert line["code"] == "ABORTED" == getattr(context.code, "name", None)
    assert "EBUSY" in str(line["error"])


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


async def test_a_report_after_a_change_shows_it_within_the_sharing_window(
    servicer: MemoryAgentServicer,
) -> None:
    """Reports share readings for up to SHARE_WINDOW_S, but a caller that changed the limits
    sees its change in the next report, however soon it asks."""
    context: Any = FakeContext()
    request = pb.GetMemoryInfoRequest(cgroups=["pod"])
    before = await memory_info(servicer, request, context)
    assert before.cgroups[0].max.unlimited
    limits = pb.SetMemoryLimitsRequest(cgroup="pod", memory=pb.LinuxMemory(limit=256 << 20))
    await servicer.SetMemoryLimits(limits, context)
    after = await memory_info(servicer, request, context)
    assert after.cgroups[0].max.bytes == 256 << 20


async def test_reports_within_the_window_share_one_reading(
    servicer: MemoryAgentServicer, fake_root: FakeRoot
) -> None:
    context: Any = FakeContext()
    request = pb.GetMemoryInfoRequest(cgroups=["pod"])
    first = await memory_info(servicer, request, context)
    # The kernel's figure moves, but a call within the window takes the reading it shares.
    (fake_root.root / "sys/fs/cgroup/pod/memory.current").write_text("12345\n")
    second = await memory_info(servicer, request, context)
    assert second.collected_at_unix_ns == first.collected_at_unix_ns
    assert second.cgroups[0].current_bytes == first.cgroups[0].current_bytes


async def test_a_change_to_one_cgroup_leaves_the_others_shared(
    servicer: MemoryAgentServicer, fake_root: FakeRoot
) -> None:
    """A runtime starting containers sets limits many times a second: each call reads its own
    cgroup afresh, and the other cgroups' readings and the system's stay shared."""
    fake_root.add_cgroup("other")
    context: Any = FakeContext()
    request = pb.GetMemoryInfoRequest(cgroups=["other"])
    first = await memory_info(servicer, request, context)
    (fake_root.root / "sys/fs/cgroup/other/memory.current").write_text("12345\n")
    limits = pb.SetMemoryLimitsRequest(cgroup="pod", memory=pb.LinuxMemory(limit=256 << 20))
    await servicer.SetMemoryLimits(limits, context)
    second = await memory_info(servicer, request, context)
    assert second.collected_at_unix_ns == first.collected_at_unix_ns
    assert second.cgroups[0].current_bytes == first.cgroups[0].current_bytes != 12345
