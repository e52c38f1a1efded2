"""Issue 25, finding by finding: what a hostile or buggy host tried, against the real daemon
on a fake tree under a service's limits. Each test failed on the main of 2026-12-03
(docs/measurements.md, "Hostile input", says how)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from guestagent.host.client import AgentClient
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.agentproc import AgentProcess
from tests.fakes.root import FakeRoot
from tests.hostile.conftest import agent_fds, limited_agent

STATE = "run/guestagent"


def code_of(call: object) -> tuple[grpc.StatusCode, str]:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def tracebacks(agent: AgentProcess) -> list[dict[str, object]]:
    return [e for e in agent.log_events() if "exception" in e]


# 1. File descriptors.


@contextlib.contextmanager
def idle_connections(path: Path, count: int) -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            try:
                sock.connect(str(path))
            except OSError:
                sock.close()
                continue
            held.append(sock)
        yield held
    finally:
        for sock in held:
            sock.close()


def open_streams(target: str, count: int, cgroups: list[str]) -> tuple[list[AgentClient], list]:
    """count WatchMemory streams, each on its own connection, each past its first message."""
    clients, streams = [], []
    for _ in range(count):
        client = AgentClient(target, timeout=10)
        clients.append(client)
        stream = client.watch(cgroups, interval_ms=1000)
        streams.append(stream)
    return clients, streams


def close_all(clients: list[AgentClient], streams: list) -> None:
    for stream in streams:
        stream.cancel()
    for client in clients:
        client.close()


@pytest.mark.slow
def test_fd_exhaustion_sheds_and_recovers(hostile: AgentProcess) -> None:
    """300 idle connections and 300 streams under RLIMIT_NOFILE 1024: the surplus is refused,
    a connection made before answers throughout, and every call answers once they are gone."""
    with AgentClient(hostile.unix_target, timeout=5) as early:
        assert early.health() == "SERVING"
        with idle_connections(hostile.unix_path, 300):
            clients, streams = open_streams(hostile.unix_target, 300, ["pod/ctr"])
            try:
                started = time.monotonic()
                assert early.health() == "SERVING"
                assert time.monotonic() - started < 1.0
                assert len(agent_fds(hostile.pid)) < 1024
            finally:
                close_all(clients, streams)
        deadline = time.monotonic() + 10
        while len(agent_fds(hostile.pid)) > 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        early.info(["pod/ctr"])
    with AgentClient(hostile.unix_target, timeout=5) as late:
        assert late.info(["pod/ctr"]).cgroups[0].path == "pod/ctr"
    events = hostile.log_events()
    noisy = [e for e in events if str(e["event"]).startswith("relay_")]
    assert len(noisy) < 50, noisy[:5]  # One line with a count per interval, not one per accept.
    assert not tracebacks(hostile)
    assert hostile.terminate(timeout=8) == 0


# 2. inotify instances.


def inotify_instances(pid: int) -> int:
    return sum(link == "anon_inode:inotify" for link in agent_fds(pid))


@pytest.mark.slow
def test_streams_share_one_inotify_instance(fake_root: FakeRoot, tmp_path: Path) -> None:
    for i in range(200):
        fake_root.add_cgroup(f"w/c{i}")
    agent = limited_agent(fake_root.root, tmp_path)
    agent.start()
    try:
        # Four connections: one holds at most 64 calls at once (HTTP/2 max streams).
        clients = [AgentClient(agent.unix_target, timeout=10) for _ in range(4)]
        streams = [clients[i % 4].watch([f"w/c{i}"], interval_ms=1000) for i in range(200)]
        try:
            for stream in streams:
                assert next(stream).reason == pb.WATCH_REASON_INITIAL
            assert inotify_instances(agent.pid) == 1
        finally:
            close_all(clients, streams)
    finally:
        agent.kill()
    assert not tracebacks(agent)


def test_watch_caps_are_invalid_argument_per_stream_resource_exhausted_for_the_agent(
    fake_root: FakeRoot, tmp_path: Path
) -> None:
    for i in range(300):
        fake_root.add_cgroup(f"w/c{i}")
    agent = limited_agent(fake_root.root, tmp_path, "--max-watches", "512")
    agent.start()
    names = [f"w/c{i}" for i in range(300)]
    try:
        with AgentClient(agent.unix_target, timeout=10) as client:
            # A request over a per-stream bound is wrong whatever else runs (as the bound
            # on reads a second); the agent-wide cap is a resource others may free.
            code, details = code_of(lambda: next(client.watch(names, interval_ms=1000)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert "256 cgroups per stream" in details
            first = client.watch(names[:256], interval_ms=1000)
            second = client.watch(names[:256], interval_ms=1000)
            next(first), next(second)
            code, details = code_of(lambda: next(client.watch(names[:1], interval_ms=1000)))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "512 watched cgroups" in details
            first.cancel()
            time.sleep(0.3)
            assert next(client.watch(names[:1], interval_ms=1000)).cgroups
            second.cancel()
    finally:
        agent.kill()
    assert not tracebacks(agent)


# 3. Big requests.


def test_names_per_request_are_bounded(hostile: AgentProcess) -> None:
    names = [f"n{i}" for i in range(5000)]
    with AgentClient(hostile.unix_target, timeout=10) as client:
        for call in (
            lambda: client.info(names),
            lambda: client.overhead(names),
            lambda: client.reclaim_status(names),
            lambda: next(client.watch(names)),
        ):
            started = time.monotonic()
            code, details = code_of(call)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, details
            assert "1024" in details and "5000" in details
            assert time.monotonic() - started < 2


def test_a_stream_costs_at_most_its_bound(hostile: AgentProcess) -> None:
    """200 cgroups every 100 ms is 2000 cgroup reads a second: over the bound, refused."""
    with AgentClient(hostile.unix_target, timeout=10) as client:
        assert next(client.watch(["pod/ctr"], interval_ms=100)).cgroups
        code, details = code_of(
            lambda: next(client.watch([f"w{i}" for i in range(200)], interval_ms=100))
        )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "per second" in details


def health_latencies(target: str, seconds: float) -> list[float]:
    latencies = []
    with AgentClient(target, timeout=10) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.monotonic()
            client.health()
            latencies.append(time.monotonic() - started)
            time.sleep(0.01)
    return latencies


@pytest.mark.slow
def test_kernel_reads_leave_the_event_loop_free(fake_root: FakeRoot, tmp_path: Path) -> None:
    names = [f"w/c{i}" for i in range(1024)]
    for name in names:
        fake_root.add_cgroup(name)
    agent = limited_agent(fake_root.root, tmp_path)
    agent.start()
    stop = threading.Event()

    def hammer() -> None:
        with AgentClient(agent.unix_target, timeout=30) as client:
            while not stop.is_set():
                client.info(names)

    workers = [threading.Thread(target=hammer) for _ in range(2)]
    try:
        idle = health_latencies(agent.unix_target, 1.0)
        for worker in workers:
            worker.start()
        time.sleep(0.5)
        busy = health_latencies(agent.unix_target, 3.0)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
        agent.kill()
    busy.sort()
    p90 = busy[int(len(busy) * 0.9)]
    assert p90 < 0.1, (
        f"health p90 {p90 * 1000:.0f} ms busy, {statistics.median(idle) * 1000:.1f} idle"
    )


# 4. Corrupt state.


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


CORRUPT = {
    "policy-list": ("reclaim-policy.json", "[1, 2]"),
    "policy-null": ("reclaim-policy.json", "null"),
    "policy-nested": ("reclaim-policy.json", nested(100_000)),
    "policy-entry-types": ("reclaim-policy.json", '{"pod/ctr": {"enabled": 1, "policy": []}}'),
    "journal-non-ascii": (
        "limits-journal.json",
        json.dumps(
            {
                "version": 1,
                "cgroup": "pod/ctr",
                "changes": [{"file": "memory.max", "old": "\u00e9\u00e9", "new": "1"}],
                "made": [],
                "enabled": [],
            }
        ),
    ),
    "journal-bad-value": (
        "limits-journal.json",
        json.dumps(
            {
                "version": 1,
                "cgroup": "pod/ctr",
                "changes": [{"file": "memory.max", "old": "1 2\n3", "new": "1"}],
                "made": [],
                "enabled": [],
            }
        ),
    ),
    "journal-nested": ("limits-journal.json", nested(100_000)),
    "swaps-list": ("swaps.json", "[[[]]]"),
    "binary": ("reclaim-policy.json", "\udcff\udcfe"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_state_is_moved_aside(fake_root: FakeRoot, tmp_path: Path, case: str) -> None:
    name, text = CORRUPT[case]
    fake_root.add_cgroup("pod/ctr", max_="4096")
    state = fake_root.root / STATE
    state.mkdir(mode=0o700, parents=True)
    (state / name).write_bytes(text.encode("utf-8", "surrogateescape"))
    (state / name).chmod(0o600)
    agent = limited_agent(fake_root.root, tmp_path)
    agent.start()
    try:
        with AgentClient(agent.unix_target, timeout=5) as client:
            (ctr,) = client.info(["pod/ctr"]).cgroups
            assert ctr.max.bytes == 4096  # Nothing was rolled "back" from a corrupt journal.
    finally:
        agent.kill()
    # Gone, or saved afresh by the agent (the reclaimer saves what it loaded).
    assert not (state / name).exists() or json.loads((state / name).read_text()) == {}
    assert [p.name for p in state.glob(f"{name}.corrupt-*")]
    moved = [e for e in agent.log_events() if e["event"] == "state_file_corrupt"]
    assert len(moved) == 1, agent.log_events()
    assert not tracebacks(agent)


@pytest.mark.parametrize("case", ["journal-directory", "state-regular-file"])
def test_state_in_the_wrong_shape_does_not_stop_the_start(
    fake_root: FakeRoot, tmp_path: Path, case: str
) -> None:
    fake_root.add_cgroup("pod/ctr")
    state = fake_root.root / STATE
    if case == "journal-directory":
        (state / "limits-journal.json").mkdir(parents=True)
        state.chmod(0o700)
    else:
        state.parent.mkdir(parents=True, exist_ok=True)
        state.write_text("not a directory")
    agent = limited_agent(fake_root.root, tmp_path)
    agent.start()
    try:
        with AgentClient(agent.unix_target, timeout=5) as client:
            assert client.info(["pod/ctr"]).cgroups
    finally:
        agent.kill()
    assert not tracebacks(agent)


# 5. The state directory.


def test_state_directory_and_files_are_private(hostile: AgentProcess, fake_root: FakeRoot) -> None:
    with AgentClient(hostile.unix_target, timeout=5) as client:
        client.set_reclaim_policy("pod/ctr", True)
    state = fake_root.root / STATE
    assert state.stat().st_mode & 0o777 == 0o700
    assert (state / "reclaim-policy.json").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("case", ["symlink", "other-writable"])
def test_an_untrusted_state_directory_is_refused(
    fake_root: FakeRoot, tmp_path: Path, case: str
) -> None:
    fake_root.add_cgroup("pod/ctr")
    (fake_root.root / "sys/fs/cgroup/pod/ctr/memory.reclaim").write_text("")
    outside = tmp_path / "outside"
    outside.mkdir()
    state = fake_root.root / STATE
    state.parent.mkdir(parents=True, exist_ok=True)
    if case == "symlink":
        state.symlink_to(outside)
    else:
        state.mkdir()
        state.chmod(0o777)
    agent = limited_agent(fake_root.root, tmp_path)
    agent.start()
    try:
        with AgentClient(agent.unix_target, timeout=5) as client:
            assert client.set_reclaim_policy("pod/ctr", True).enabled
            info = client.info()
    finally:
        agent.kill()
    assert "not persist" in info.state_unavailable
    assert not list(outside.iterdir())
    assert not (state / "reclaim-policy.json").exists()
    refused = [e for e in agent.log_events() if e["event"] == "state_directory_refused"]
    assert len(refused) == 1


def test_a_world_writable_journal_is_not_applied(fake_root: FakeRoot, tmp_path: Path) -> None:
    fake_root.add_cgroup("pod/ctr")
    other = fake_root.add_cgroup("other", max_="max")
    state = fake_root.root / STATE
    state.mkdir(mode=0o700, parents=True)
    journal = state / "limits-journal.json"
    change = {"file": "memory.max", "old": "1", "new": "max"}
    journal.write_text(
        json.dumps(
            {"version": 1, "cgroup": "other", "changes": [change], "made": [], "enabled": []}
        )
    )
    journal.chmod(0o777)
    agent = limited_agent(fake_root.root, tmp_path)
    agent.start()
    agent.kill()
    assert (other / "memory.max").read_text().strip() == "max"
    assert list(state.glob("limits-journal.json.corrupt-*"))


def test_a_symlinked_temporary_file_is_not_followed(
    hostile: AgentProcess, fake_root: FakeRoot, tmp_path: Path
) -> None:
    state = fake_root.root / STATE
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = tmp_path / "planted"
    (state / ".reclaim-policy.json.tmp").symlink_to(target)
    with AgentClient(hostile.unix_target, timeout=5) as client:
        client.set_reclaim_policy("pod/ctr", True)
    assert not target.exists()


# 6. Aliases.


def test_aliases_are_one_cgroup(hostile: AgentProcess, fake_root: FakeRoot) -> None:
    aliases = ["pod/ctr", "pod/ctr/", "pod/ctr//", "pod//ctr"]
    with AgentClient(hostile.unix_target, timeout=5) as client:
        for alias in aliases:
            assert client.set_reclaim_policy(alias, True).cgroup == "pod/ctr"
        assert [t.cgroup for t in client.reclaim_status().targets] == ["pod/ctr"]
        assert [c.path for c in client.info(aliases).cgroups] == ["pod/ctr"]
    saved = json.loads((fake_root.root / STATE / "reclaim-policy.json").read_text())
    assert list(saved) == ["pod/ctr"]


# 7. Status codes and half-applied calls.


def test_set_reclaim_policy_is_all_or_nothing(hostile: AgentProcess, fake_root: FakeRoot) -> None:
    state = fake_root.root / STATE
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    (state / ".reclaim-policy.json.tmp").mkdir()  # The save's temporary file cannot be made.
    with AgentClient(hostile.unix_target, timeout=5) as client:
        code, details = code_of(lambda: client.set_reclaim_policy("pod/ctr", True))
        assert code == grpc.StatusCode.FAILED_PRECONDITION, details
        assert not client.reclaim_status().targets


def test_undecodable_request_is_invalid_argument_and_audited(hostile: AgentProcess) -> None:
    with grpc.insecure_channel(f"unix:{hostile.unix_path}") as channel:
        call: grpc.UnaryUnaryMultiCallable = channel.unary_unary(
            "/guestagent.v1.MemoryAgent/SetMemoryLimits"
        )
        code, details = code_of(lambda: call(b"\xff\xff\xff\xff", timeout=5))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    audits = [e for e in hostile.log_events() if e["event"] == "audit"]
    assert audits and audits[-1]["method"] == "SetMemoryLimits"
    assert audits[-1]["code"] == "INVALID_ARGUMENT"


@pytest.mark.parametrize("name", ["..", "/etc", "a\x00b", "pod/../.."])
def test_get_reclaim_status_validates_names(hostile: AgentProcess, name: str) -> None:
    with AgentClient(hostile.unix_target, timeout=5) as client:
        code, _ = code_of(lambda: client.reclaim_status([name]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_emfile_is_resource_exhausted() -> None:
    import errno

    from guestagent.agent.rpc import status_for
    from guestagent.errors import kernel_error

    for number in (errno.EMFILE, errno.ENFILE):
        error = kernel_error("open", "/x", None, OSError(number, os.strerror(number)))
        assert status_for(error)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED


# 8. Messages.


@pytest.mark.parametrize("name", ["x/" * 2000 + "y", "a" * 200 + "\x00" + "b" * 3000])
def test_quoted_values_are_capped(hostile: AgentProcess, name: str) -> None:
    with AgentClient(hostile.unix_target, timeout=5) as client:
        code, details = code_of(lambda: client.info([name]))
    assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
    assert len(details) < 400 and "\x00" not in details


# Beyond the list.


def test_huge_metadata_is_refused_and_the_agent_answers(hostile: AgentProcess) -> None:
    with AgentClient(hostile.unix_target, timeout=5) as client:
        metadata: tuple[tuple[str, str | bytes], ...] = (("x-junk", "j" * (1 << 20)),)
        code, _ = code_of(
            lambda: client.stub.GetMemoryInfo(
                pb.GetMemoryInfoRequest(), metadata=metadata, timeout=5
            )
        )
        assert code != grpc.StatusCode.OK
        assert client.health() == "SERVING"


@pytest.mark.slow
def test_many_concurrent_unary_calls(hostile: AgentProcess) -> None:
    with AgentClient(hostile.unix_target, timeout=30) as client:
        request = pb.GetMemoryInfoRequest(cgroups=["pod/ctr"])
        futures = [client.stub.GetMemoryInfo.future(request, timeout=30) for _ in range(2000)]
        started = time.monotonic()
        assert client.health() == "SERVING"
        health_s = time.monotonic() - started
        codes = [code_of(f.result)[0] for f in futures]
    # Over the cap of 512 calls at once: RESOURCE_EXHAUSTED, or CANCELLED when grpc resets
    # the stream before its status goes out; never a hang or a crash.
    allowed = {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED}
    assert set(codes) <= allowed and grpc.StatusCode.OK in codes
    assert health_s < 5
    with AgentClient(hostile.unix_target, timeout=5) as client:
        assert client.info(["pod/ctr"]).cgroups
    assert not tracebacks(hostile)
