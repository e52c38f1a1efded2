"""Listeners of the real daemon: a taken address fails the second agent loudly, and the unix
socket is never reachable with wider permissions than 0600, not even for a moment."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from guestagent.host.client import AgentClient
from guestagent.linux import syscalls
from tests.fakes.agentproc import AgentProcess
from tests.fakes.root import FakeRoot

IN_ATTRIB = 0x4
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
_EVENT = struct.Struct("iIII")


def serve(root: Path, *listen: str) -> subprocess.CompletedProcess[str]:
    args = [a for address in listen for a in ("--listen", address)]
    return subprocess.run(
        [sys.executable, "-m", "guestagent", "serve", "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_in_use(result: subprocess.CompletedProcess[str], address: str) -> None:
    assert result.returncode == 1, result
    events = [json.loads(line) for line in result.stderr.splitlines()]
    (fatal,) = [e for e in events if e["level"] == "error"]
    error = fatal["error"]
    assert error.startswith(f"{address} is in use")
    assert "another agent" in error and "kata-agent" in error and "guestagent" in error


@pytest.mark.parametrize("which", ["tcp", "unix"])
def test_a_second_agent_on_a_taken_address_exits_1(
    agent: AgentProcess, fake_root: FakeRoot, which: str
) -> None:
    address = agent.tcp_target if which == "tcp" else agent.unix_target
    assert_in_use(serve(fake_root.root, address), address)
    # The first agent keeps its address and still answers on both.
    for target in (agent.unix_target, agent.tcp_target):
        with AgentClient(target) as client:
            assert client.health("") == "SERVING"


def test_nothing_is_left_bound_when_a_later_address_is_taken(
    agent: AgentProcess, fake_root: FakeRoot, tmp_path: Path
) -> None:
    fresh = tmp_path / "fresh.sock"
    assert_in_use(serve(fake_root.root, f"unix://{fresh}", agent.tcp_target), agent.tcp_target)
    assert not fresh.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".guestagent-")] == []


def test_a_stale_socket_is_replaced(fake_root: FakeRoot, tmp_path: Path) -> None:
    process = AgentProcess(fake_root.root, tmp_path)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(process.unix_path))
    stale.close()  # The file stays, nobody listens: what a crashed agent leaves.
    process.start()
    try:
        with AgentClient(process.unix_target) as client:
            assert client.health("") == "SERVING"
    finally:
        process.kill()


def test_a_file_in_the_way_is_not_removed(fake_root: FakeRoot, tmp_path: Path) -> None:
    in_the_way = tmp_path / "data"
    in_the_way.write_text("keep me")
    result = serve(fake_root.root, f"unix://{in_the_way}")
    assert result.returncode == 1
    assert "not a socket" in result.stderr
    assert in_the_way.read_text() == "keep me"


def inotify_events(fd: int) -> list[tuple[int, str]]:
    try:
        data = os.read(fd, 64 * 1024)
    except BlockingIOError:
        return []
    events, offset = [], 0
    while offset < len(data):
        _wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
        name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
        events.append((mask, name.decode()))
        offset += _EVENT.size + length
    return events


def test_the_unix_socket_is_never_wider_than_0600(fake_root: FakeRoot, tmp_path: Path) -> None:
    process = AgentProcess(fake_root.root, tmp_path)
    fd = syscalls.inotify_init()
    syscalls.inotify_add_watch(fd, tmp_path, IN_CREATE | IN_MOVED_TO | IN_ATTRIB)
    modes: set[int] = set()
    done = threading.Event()

    def watch_mode() -> None:
        # As fast as it can: a socket bound at the final path and chmod-ed afterwards would
        # show its umask mode here for a moment.
        while not done.is_set():
            with contextlib.suppress(FileNotFoundError):
                modes.add(stat.S_IMODE(os.lstat(process.unix_path).st_mode))

    watcher = threading.Thread(target=watch_mode, daemon=True)
    watcher.start()
    try:
        process.start()
        done.set()
        watcher.join()
        events = [(mask, name) for mask, name in inotify_events(fd) if name == "agent.sock"]
    finally:
        done.set()
        os.close(fd)
        process.kill()
    assert modes == {0o600}
    # It appears once, complete: no attribute change at the final path (no chmod after bind).
    assert events and all(not mask & IN_ATTRIB for mask, _ in events), events
    assert stat.S_ISSOCK(os.lstat(process.unix_path).st_mode)


def test_sigterm_removes_the_socket_it_made(fake_root: FakeRoot, tmp_path: Path) -> None:
    process = AgentProcess(fake_root.root, tmp_path)
    process.start()
    assert process.terminate() == 0
    assert not process.unix_path.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".guestagent-")] == []
