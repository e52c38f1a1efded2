"""The real daemon, over unix and tcp, called with guestctl and the client library."""

import contextlib
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from guestagent.host.client import AgentClient
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.agentproc import AgentProcess, guestctl
from tests.fakes.hvsock import hybrid_vsock_server
from tests.fakes.root import FakeRoot


def test_guestctl_info_text_and_json(agent: AgentProcess) -> None:
    text = guestctl("--target", agent.unix_target, "info", "--cgroup", "pod/ctr")
    assert text.returncode == 0, text.stderr
    assert "total 487.1 MiB" in text.stdout
    assert "cgroup pod/ctr" in text.stdout
    assert "oom_kill=1" in text.stdout
    as_json = guestctl("--target", agent.tcp_target, "--json", "info")
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert int(report["system"]["mem_total_bytes"]) == 498764 * 1024
    assert report["pressure"]["some"]["avg10"] == 1.5


@pytest.mark.parametrize(
    ("cgroup", "code", "words"),
    [
        ("../../etc", "INVALID_ARGUMENT (CGROUP_PATH_INVALID)", "'..'"),
        ("/pod", "INVALID_ARGUMENT (CGROUP_PATH_INVALID)", "absolute"),
        ("pod/missing", "NOT_FOUND (CGROUP_NOT_FOUND)", "'pod/missing'"),
    ],
)
def test_bad_cgroups_get_clear_errors(
    agent: AgentProcess, cgroup: str, code: str, words: str
) -> None:
    result = guestctl("--target", agent.unix_target, "info", "--cgroup", cgroup)
    assert result.returncode == 1
    assert f"guestctl: {code}: " in result.stderr and words in result.stderr


def test_missing_psi_is_absent(agent: AgentProcess, fake_root: FakeRoot) -> None:
    (fake_root.root / "proc/pressure/memory").unlink()
    with AgentClient(agent.tcp_target) as client:
        info = client.info()
    assert not info.HasField("pressure")


def test_unix_socket_is_owner_only(agent: AgentProcess) -> None:
    assert stat.S_IMODE(os.stat(agent.unix_path).st_mode) == 0o600


def test_health_and_reflection(agent: AgentProcess) -> None:
    with AgentClient(agent.unix_target) as client:
        assert client.health("guestagent.v1.MemoryAgent") == "SERVING"
        stub = reflection_pb2_grpc.ServerReflectionStub(client.channel)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert {"guestagent.v1.MemoryAgent", "grpc.health.v1.Health"} <= names


def test_a_health_request_over_its_limit_is_invalid_argument(agent: AgentProcess) -> None:
    """The health service reads a request field by field on the event loop: one of 4 MiB
    would hold every call; a service name is tens of bytes (agent/health.py)."""
    unknown_fields = b"\x10\x00" * 2500  # Field 2, varint 0: 5000 bytes.
    with grpc.insecure_channel(agent.unix_target) as channel:
        check: Any = channel.unary_unary("/grpc.health.v1.Health/Check")
        with pytest.raises(grpc.RpcError) as refused:
            check(unknown_fields, timeout=10)
        assert check(b"", timeout=10) == b"\x08\x01"  # SERVING, after.
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "5000 bytes, over the 4096" in str(refused.value.details())


def test_reflection_as_the_first_call_finds_the_contract(agent: AgentProcess) -> None:
    """The contract's descriptors load with its first call; reflection, asked first, loads
    them itself (grpcurl describing the service before calling it)."""
    with AgentClient(agent.unix_target) as client:
        stub = reflection_pb2_grpc.ServerReflectionStub(client.channel)
        request = reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="guestagent.v1.MemoryAgent"
        )
        (reply,) = list(stub.ServerReflectionInfo(iter([request])))
    assert reply.WhichOneof("message_response") == "file_descriptor_response"
    files = reply.file_descriptor_response.file_descriptor_proto
    assert any(b"MemoryAgent" in proto for proto in files)


def test_logs_are_json_lines(agent: AgentProcess) -> None:
    events = agent.log_events()
    serving = next(e for e in events if e["event"] == "serving")
    assert agent.unix_target in serving["listen"]  # type: ignore[operator]


def test_watch_fires_on_memory_events_before_the_interval(
    agent: AgentProcess, fake_root: FakeRoot
) -> None:
    events_file = fake_root.root / "sys/fs/cgroup/pod/ctr/memory.events"
    with AgentClient(agent.unix_target) as client:
        stream = client.watch(["pod/ctr"], interval_ms=60_000)
        first = next(stream)
        assert first.reason == pb.WATCH_REASON_INITIAL
        started = time.monotonic()
        events_file.write_text("low 0\nhigh 3\nmax 2\noom 2\noom_kill 2\n")
        changed = next(stream)
        elapsed = time.monotonic() - started
        stream.cancel()
    assert changed.reason == pb.WATCH_REASON_MEMORY_EVENTS
    assert list(changed.changed_cgroups) == ["pod/ctr"]
    assert changed.cgroups[0].events.oom_kill == 2
    assert elapsed < 30  # Well before the 60 s interval.


def test_watch_interval_ticks(agent: AgentProcess) -> None:
    with AgentClient(agent.unix_target) as client:
        stream = client.watch(interval_ms=100)
        reasons = [next(stream).reason for _ in range(3)]
        stream.cancel()
    assert reasons == [pb.WATCH_REASON_INITIAL, pb.WATCH_REASON_INTERVAL, pb.WATCH_REASON_INTERVAL]


@pytest.mark.parametrize(
    ("interval", "trigger", "words"),
    [
        (10, None, "below the minimum"),
        (0, pb.PressureTrigger(stall_us=1, window_us=50), "outside"),
    ],
)
def test_watch_refusals(
    agent: AgentProcess, interval: int, trigger: pb.PressureTrigger | None, words: str
) -> None:
    with AgentClient(agent.unix_target) as client, pytest.raises(grpc.RpcError) as raised:
        next(client.watch(interval_ms=interval, trigger=trigger))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in (raised.value.details() or "")


def inotify_fds(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):  # Closed while we looked.
            count += "inotify" in os.readlink(fd)
    return count


def test_a_client_that_goes_away_frees_its_watch(agent: AgentProcess) -> None:
    assert agent.proc is not None
    baseline = inotify_fds(agent.proc.pid)
    client = AgentClient(agent.unix_target)
    stream = client.watch(["pod/ctr"], interval_ms=60_000)
    next(stream)
    assert inotify_fds(agent.proc.pid) == baseline + 1
    client.close()  # The channel goes away without cancelling politely.
    deadline = time.monotonic() + 10
    while inotify_fds(agent.proc.pid) != baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    assert inotify_fds(agent.proc.pid) == baseline


def test_sigterm_ends_streams_and_exits_zero(agent: AgentProcess) -> None:
    """WatchMemory's streams and health's Watch end (OK) as the agent stops, health's once it
    has said NOT_SERVING: a stream cancelled at the end of the grace period would raise."""
    with AgentClient(agent.unix_target) as client:
        stream = client.watch(interval_ms=60_000)
        next(stream)
        health_stream = health_pb2_grpc.HealthStub(client.channel).Watch(
            health_pb2.HealthCheckRequest(service="guestagent.v1.MemoryAgent")
        )
        assert next(health_stream).status == health_pb2.HealthCheckResponse.SERVING
        ended = threading.Event()
        health_after: list[int] = []

        def drain() -> None:
            for _ in stream:
                pass
            health_after.extend(reply.status for reply in health_stream)
            ended.set()

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        assert agent.terminate() == 0
        reader.join(timeout=10)
        assert ended.is_set(), "streams did not end cleanly on SIGTERM"
        assert health_after == [health_pb2.HealthCheckResponse.NOT_SERVING]
    assert [e["event"] for e in agent.log_events()][-2:] == ["stopping", "stopped"]


def test_hybrid_vsock_target_through_the_client_relay(agent: AgentProcess, tmp_path: Path) -> None:
    vsock_path = str(tmp_path / "ch-vsock.sock")
    server = hybrid_vsock_server(vsock_path, b"OK 1073741824\n", str(agent.unix_path))
    try:
        result = guestctl("--target", f"hvsock://{vsock_path}:1024", "--json", "info")
    finally:
        server.close()
    assert result.returncode == 0, result.stderr
    assert int(json.loads(result.stdout)["system"]["mem_total_bytes"]) == 498764 * 1024


def test_limits_over_the_daemon(agent: AgentProcess, fake_root: FakeRoot) -> None:
    result = guestctl(
        "--target",
        agent.unix_target,
        "limits",
        "--cgroup",
        "pod/ctr",
        "--limit",
        "64M",
        "--swap",
        "192M",
    )
    assert result.returncode == 0, result.stderr
    directory = fake_root.root / "sys/fs/cgroup/pod/ctr"
    assert (directory / "memory.max").read_text() == str(64 << 20)
    assert (directory / "memory.swap.max").read_text() == str(128 << 20)
    assert "memory.swap.max 134217728" in result.stdout and "untouched: memory.low" in result.stdout


@pytest.mark.parametrize(
    ("memory", "words"),
    [
        (pb.LinuxMemory(limit=64 << 20, swappiness=60), "swappiness=60"),
        (pb.LinuxMemory(limit=64 << 20, kernel=1 << 20), "kernel=1048576"),
        (
            pb.LinuxMemory(limit=128 << 20, swap=64 << 20),
            "67108864 is less than memory limit 134217728",
        ),
        (pb.LinuxMemory(swap=64 << 20), "needs a memory limit"),
        (pb.LinuxMemory(limit=-5), "memory limit -5 is neither bytes nor -1"),
    ],
)
def test_limits_refusals_write_nothing(
    agent: AgentProcess, fake_root: FakeRoot, memory: pb.LinuxMemory, words: str
) -> None:
    directory = fake_root.root / "sys/fs/cgroup/pod/ctr"
    before = {f: (directory / f).read_text() for f in ("memory.max", "memory.swap.max")}
    with AgentClient(agent.unix_target) as client, pytest.raises(grpc.RpcError) as raised:
        client.set_limits("pod/ctr", memory)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in (raised.value.details() or "")
    assert {f: (directory / f).read_text() for f in before} == before


def test_oversize_requests_are_refused(agent: AgentProcess) -> None:
    with AgentClient(agent.unix_target) as client, pytest.raises(grpc.RpcError) as raised:
        client.info(["x" * 1024] * 5000)  # ~5 MiB, over the 4 MiB limit
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with AgentClient(agent.unix_target) as client:
        assert client.health() == "SERVING"


def test_online_memory_off_refuses_the_rpc_naming_the_flag(
    fake_root: FakeRoot, tmp_path: Path
) -> None:
    fake_root.write("sys/devices/system/memory/block_size_bytes", "8000000\n")
    state = fake_root.write("sys/devices/system/memory/memory8/state", "offline\n")
    agent = AgentProcess(fake_root.root, tmp_path, extra_args=("--online-memory", "off"))
    agent.start()
    try:
        result = guestctl("--target", agent.unix_target, "online-memory")
    finally:
        agent.kill()
    assert result.returncode != 0
    assert "FAILED_PRECONDITION" in result.stderr and "--online-memory off" in result.stderr
    assert state.read_text() == "offline\n"


def test_a_confidential_agent_reports_it_and_refuses_swap_in_the_clear(
    fake_root: FakeRoot, tmp_path: Path
) -> None:
    agent = AgentProcess(fake_root.root, tmp_path, extra_args=("--confidential=yes",))
    agent.start()
    try:
        info = guestctl("--target", agent.unix_target, "info")
        refused = guestctl(
            "--target",
            agent.unix_target,
            "swap",
            "enable",
            "--device",
            "/dev/vdb",
            "--encryption",
            "none",
        )
    finally:
        agent.kill()
    assert "guest    confidential other (--confidential=yes)" in info.stdout, info.stderr
    assert refused.returncode != 0
    assert "FAILED_PRECONDITION" in refused.stderr
    assert "confidential guest (other, from --confidential=yes)" in refused.stderr
    serving = next(e for e in agent.log_events() if e.get("event") == "serving")
    assert serving["confidential"] == "other"
