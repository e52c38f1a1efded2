"""Issue 25 in a real guest: 300 vsock connections, each holding a WatchMemory stream, against
an agent under the unit's descriptor limit (LimitNOFILE=8192 hard, systemd's 1024 soft);
the surplus over the connection cap is refused, a connection made before answers throughout,
and once they are gone a new call answers."""

from __future__ import annotations

import json

import pytest

from guestagent.vm.qemu import GuestVM
from tests.vm.guest import GUESTCTL, guestctl, wait_until
from tests.vm.pace import Deadline, Pace

pytestmark = pytest.mark.vm

PORT = 1026
CONNECTIONS = 300

# Run in the guest with guestctl's interpreter and package (the agent's runtime tree carries
# only what the agent runs, and the host's dialling is not in it): one relay from a unix
# socket to the agent's vsock port (CID 1, the loopback), and a grpc channel per connection
# (a local subchannel pool, so each is its own connection), each with a stream.
FLOOD = """
import json, socket, sys, tempfile, time, os, functools
sys.path.insert(0, "/usr/local/lib/guestctl")
import grpc
from guestagent.transport.address import VsockAddress
from guestagent.transport.dial import dial_vsock
from guestagent.transport.relay import SocketRelay
from guestagent.v1 import agent_pb2 as pb, agent_pb2_grpc as pb_grpc

count = int(sys.argv[1])
path = os.path.join(tempfile.mkdtemp(), "relay.sock")
listener = socket.socket(socket.AF_UNIX)
listener.bind(path)
listener.listen(1024)
SocketRelay(listener, dial=functools.partial(dial_vsock, VsockAddress(1, int(sys.argv[2])))).start()
options = [("grpc.use_local_subchannel_pool", 1)]

def stub():
    return pb_grpc.MemoryAgentStub(grpc.insecure_channel("unix:" + path, options=options))

early = stub()
early.GetMemoryInfo(pb.GetMemoryInfoRequest(), timeout=30)
streams = [stub().WatchMemory(pb.WatchMemoryRequest(), timeout=120) for _ in range(count)]
got, refused = 0, {}
for s in streams:
    try:
        next(s)
        got += 1
    except grpc.RpcError as e:
        refused[e.code().name] = refused.get(e.code().name, 0) + 1
started = time.monotonic()
early.GetMemoryInfo(pb.GetMemoryInfoRequest(), timeout=30)
during_ms = (time.monotonic() - started) * 1000
for s in streams:
    s.cancel()
print(json.dumps({"streams": got, "refused": refused, "during_ms": round(during_ms, 1)}))
"""


def agent_fds(vm: GuestVM, pid: str) -> int:
    return int(vm.exec(f"ls /proc/{pid}/fd | wc -l").stdout)


def test_300_vsock_streams_then_a_call_answers(vm: GuestVM, pace: Pace) -> None:
    vm.exec(
        f"ulimit -Hn 8192; ulimit -Sn 1024; /opt/guestagent/bin/guestagent serve "
        f"--listen vsock://:{PORT} --allow-cid 1 --no-self-cgroup --online-memory off "
        "</dev/null >/run/hostile.log 2>&1 & echo $! > /run/hostile.pid"
    )
    pid = vm.exec(["cat", "/run/hostile.pid"]).stdout.strip()
    try:
        starting = Deadline(pace.scale(90))
        wait_until(
            lambda: guestctl(vm, f"vsock://1:{PORT}", "health", deadline=starting).rc == 0 or None,
            starting.seconds,
            "the second agent to serve over vsock",
        )
        # guestctl's shebang: the interpreter and its flags.
        interpreter = vm.exec(["head", "-1", GUESTCTL]).stdout.strip().removeprefix("#!")
        # The client holds 7 descriptors a connection too (its own relay): 1024 is not enough.
        flood = vm.exec(
            f"ulimit -n 8192; exec {interpreter} - {CONNECTIONS} {PORT}",
            stdin=FLOOD,
            timeout=pace.scale(240),
        )
        figures = json.loads(flood.stdout.strip().splitlines()[-1])
        assert figures["streams"] + sum(figures["refused"].values()) == CONNECTIONS
        assert figures["streams"] >= 200, figures
        assert set(figures["refused"]) <= {"UNAVAILABLE"}, figures
        # The early connection's call answered within its 30 s deadline (in flood, where 255
        # streams each get a report a second: 9.6 s in a TCG guest at pace 4.7x, 2026-12-03).
        print(f"hostile flood: {figures}")
        after = Deadline(pace.scale(60))
        answered = guestctl(vm, f"vsock://1:{PORT}", "--json", "info", deadline=after)
        assert answered.rc == 0, answered.stderr
        wait_until(lambda: agent_fds(vm, pid) < 100 or None, pace.scale(30), "fds released")
        log = vm.exec(["cat", "/run/hostile.log"]).stdout.splitlines()
        events = [json.loads(line) for line in log if line.startswith("{")]
        assert any(e["event"] == "nofile_raised" and e["to"] == 8192 for e in events)
        assert not [e for e in events if "exception" in e]
        assert sum(str(e["event"]).startswith("relay_") for e in events) < 20
    finally:
        vm.exec("kill $(cat /run/hostile.pid); true")
