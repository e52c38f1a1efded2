"""The agent in a real guest: the memory report, the watch stream, vsock and its peer check."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator

import pytest

from guestagent.host.client import AgentClient
from guestagent.linux.meminfo import parse_meminfo
from guestagent.transport.address import DEFAULT_VSOCK_PORT
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import guestctl, make_cgroup, start_filler, stop_filler, wait_until
from tests.vm.pace import Deadline, Pace

pytestmark = pytest.mark.vm


def test_memory_info_matches_proc_meminfo(vm: GuestVM, agent: AgentClient) -> None:
    info = agent.info()
    meminfo = parse_meminfo(vm.exec(["cat", "/proc/meminfo"]).stdout)
    assert info.system.mem_total_bytes == meminfo["MemTotal"]
    assert info.system.swap_total_bytes == meminfo["SwapTotal"]
    # Free memory moves between the two reads; it stays within a few MiB.
    assert abs(info.system.mem_available_bytes - meminfo["MemAvailable"]) < 32 << 20
    assert info.HasField("pressure")


def test_cgroup_report_reads_the_kernel(vm: GuestVM, agent: AgentClient) -> None:
    make_cgroup(vm, "report", memory_max="100M")
    (cgroup,) = agent.info(["report"]).cgroups
    assert not cgroup.max.unlimited and cgroup.max.bytes == 100 << 20
    assert cgroup.high.unlimited
    assert cgroup.HasField("swap_max") and cgroup.swap_max.unlimited
    assert cgroup.HasField("pressure")


def collect(stream: Iterator[pb.MemoryInfo], into: queue.Queue[pb.MemoryInfo]) -> None:
    try:
        for message in stream:
            into.put(message)
    except Exception:  # The stream is cancelled when the test ends.
        return


def test_watch_fires_when_a_process_hits_memory_high(
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> None:
    make_cgroup(vm, "watched", memory_high="24M")
    stream = agent.watch(
        ["watched"],
        interval_ms=60_000,
        trigger=pb.PressureTrigger(stall_us=50_000, window_us=500_000),
    )
    messages: queue.Queue[pb.MemoryInfo] = queue.Queue()
    threading.Thread(target=collect, args=(stream, messages), daemon=True).start()
    try:
        assert messages.get(timeout=pace.scale(60)).reason == pb.WATCH_REASON_INITIAL
        start_filler(vm, "watched", 64, name="highfill")
        reasons = set()
        while pb.WATCH_REASON_MEMORY_EVENTS not in reasons:
            # Below the 60 s interval twice over on an idle host; a busy one may take longer.
            message = messages.get(timeout=pace.scale(120))
            reasons.add(message.reason)
            if message.reason == pb.WATCH_REASON_MEMORY_EVENTS:
                assert list(message.changed_cgroups) == ["watched"]
                assert message.cgroups[0].events.high > 0
        assert pb.WATCH_REASON_INTERVAL not in reasons
    finally:
        stream.cancel()
        stop_filler(vm, "highfill")


def guest_log_events(vm: GuestVM) -> list[dict[str, object]]:
    lines = vm.exec(["cat", "/var/log/guestagent.log"]).stdout.splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def test_vsock_peers_other_than_the_host_are_refused(vm: GuestVM, pace: Pace) -> None:
    # In the guest, over vsock_loopback the caller is CID 1: a container could be that.
    result = guestctl(
        vm, f"vsock://1:{DEFAULT_VSOCK_PORT}", "health", deadline=Deadline(pace.scale(30))
    )
    assert result.rc == 1, result
    refused = wait_until(
        lambda: [e for e in guest_log_events(vm) if e["event"] == "vsock_peer_refused"],
        pace.scale(30),
        "the refusal to be logged",
    )
    assert refused[-1]["cid"] == 1 and refused[-1]["allowed"] == [2]


def test_allow_cid_admits_the_loopback_peer(vm: GuestVM, pace: Pace) -> None:
    vm.exec(
        "/opt/guestagent/bin/guestagent serve --listen vsock://:1025 --allow-cid 1 "
        "</dev/null >/run/agent2.log 2>&1 & echo $! > /run/agent2.pid"
    )
    try:
        starting = Deadline(pace.scale(90))
        result = wait_until(
            lambda: (
                r
                if (r := guestctl(vm, "vsock://1:1025", "--json", "info", deadline=starting)).rc
                == 0
                else None
            ),
            starting.seconds,
            "the second agent to serve over vsock",
        )
        reported = int(json.loads(result.stdout)["system"]["mem_total_bytes"])
        meminfo = parse_meminfo(vm.exec(["cat", "/proc/meminfo"]).stdout)
        assert reported == meminfo["MemTotal"]
    finally:
        vm.exec("kill $(cat /run/agent2.pid); true")


GUESTAGENT = "/opt/guestagent/bin/guestagent"


def test_a_second_agent_on_the_vsock_port_fails_naming_it(vm: GuestVM, agent: AgentClient) -> None:
    result = vm.exec(
        [GUESTAGENT, "serve", "--listen", f"vsock://:{DEFAULT_VSOCK_PORT}"], check=False
    )
    assert result.rc == 1, result
    events = [json.loads(line) for line in result.stderr.splitlines()]
    (fatal,) = [e for e in events if e["level"] == "error"]  # after self_cgroup's info line
    error = fatal["error"]
    assert error.startswith(f"vsock://:{DEFAULT_VSOCK_PORT} is in use: another agent")
    assert "kata-agent" in error
    assert agent.health("") == "SERVING"  # The first agent keeps its port.


def test_relayed_calls_are_audited_with_the_vsock_cid_and_the_unix_uid(
    vm: GuestVM, pace: Pace
) -> None:
    port = DEFAULT_VSOCK_PORT + 1
    vm.exec(
        f"{GUESTAGENT} serve --listen vsock://:{port} --listen unix:///run/agent3.sock "
        "--allow-cid 1 </dev/null >/run/agent3.log 2>&1 & echo $! > /run/agent3.pid"
    )
    try:
        starting = Deadline(pace.scale(90))
        wait_until(
            lambda: guestctl(vm, f"vsock://1:{port}", "compact", deadline=starting).rc == 0,
            starting.remaining(),
            "a Compact over vsock to the second agent",
        )
        done = guestctl(vm, "unix:///run/agent3.sock", "compact", deadline=Deadline(pace.scale(30)))
        assert done.rc == 0, done.stderr
        lines = [
            json.loads(line)
            for line in vm.exec(["cat", "/run/agent3.log"]).stdout.splitlines()
            if line.startswith("{")
        ]
    finally:
        vm.exec("kill $(cat /run/agent3.pid); true")
    audits = [e for e in lines if e["event"] == "audit" and e["code"] == "OK"]
    assert [e["method"] for e in audits[-2:]] == ["Compact", "Compact"]
    vsock, unix = audits[-2:]
    assert str(vsock["peer"]).startswith("vsock:1:"), vsock
    assert str(unix["peer"]).startswith("unix:uid=0,gid=0,pid="), unix


def test_the_bundle_carries_no_host_only_code(vm: GuestVM) -> None:
    site = "/opt/guestagent/lib/python3/dist-packages/guestagent"
    shipped = vm.exec(["ls", site]).stdout.split()
    assert {"agent", "linux", "ops"} <= set(shipped)  # the listing is of the right place
    assert not {"host", "vm", "build"} & set(shipped), shipped


def test_a_watched_cgroup_removed_and_made_again_wakes_the_stream(
    vm: GuestVM, agent: AgentClient
) -> None:
    """rmdir and mkdir of a watched cgroup each send a message at once (its parent
    directory's inotify watch; its removed memory.events hears nothing on cgroupfs), long
    before the stream's interval of a minute, and the stream goes on."""
    make_cgroup(vm, "comes-and-goes")
    stream = agent.watch(["comes-and-goes"], interval_ms=60_000)
    try:
        assert next(stream).reason == pb.WATCH_REASON_INITIAL
        vm.exec(["rmdir", "/sys/fs/cgroup/comes-and-goes"])
        gone = next(stream)
        make_cgroup(vm, "comes-and-goes")
        back = next(stream)
    finally:
        stream.cancel()
        vm.exec("rmdir /sys/fs/cgroup/comes-and-goes; true")
    assert (gone.reason, list(gone.changed_cgroups)) == (
        pb.WATCH_REASON_MEMORY_EVENTS,
        ["comes-and-goes"],
    )
    assert list(gone.removed_cgroups) == ["comes-and-goes"] and not gone.cgroups
    assert back.reason == pb.WATCH_REASON_MEMORY_EVENTS
    assert [c.path for c in back.cgroups] == ["comes-and-goes"] and not back.removed_cgroups
