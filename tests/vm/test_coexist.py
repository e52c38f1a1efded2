"""The agent beside a VM's init agent: a stand-in holding vsock port 1024 (kata-agent's and
vminitd's port) is started first by the guest's init, then the agent; both serve, each on its
own port. Host-to-guest vsock is not available on every test machine, so the ports are reached
from inside the guest over vsock loopback (CID 1), which the agent admits here by --allow-cid."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestagent.build.runtime import INTERPRETER_FLAGS
from guestagent.host.sizing.boot import VMConfig
from guestagent.transport.address import DEFAULT_VSOCK_PORT
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import boot_and_record, read_guest

pytestmark = pytest.mark.vm

INIT_AGENT_PORT = 1024
GUESTCTL = "/usr/local/bin/guestctl"
STANDIN = "/usr/local/sbin/guestagent-standin"
LOOPBACK_CID = 1
RESULTS: dict[str, object] = {}

# Connects over vsock loopback and prints the first line the server sends.
READ_BANNER = """
import socket, sys
with socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM) as s:
    s.settimeout(30)
    s.connect((1, int(sys.argv[1])))
    print(s.makefile("rb").readline().decode().strip())
"""


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    config = VMConfig(
        agent_args=("--allow-cid", str(LOOPBACK_CID)),
        extra_cmdline=f"guestagent.standin={INIT_AGENT_PORT}",
    )
    yield from boot_and_record(config, image, tmp_path_factory, RESULTS, "coexist")


def start_ticks(vm: GuestVM, pid: str) -> int:
    # Field 22 of /proc/PID/stat: start time in clock ticks after boot (the name may hold spaces,
    # so count from its closing parenthesis).
    return int(read_guest(vm, f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[19])


def only_pid(vm: GuestVM, pattern: str) -> str:
    pids = vm.exec(["pgrep", "-f", pattern]).stdout.split()
    assert len(pids) == 1, f"{pattern}: {pids}"
    return pids[0]


def test_the_stand_in_started_first(vm: GuestVM) -> None:
    standin = only_pid(vm, f"^/usr/bin/python3 {STANDIN} {INIT_AGENT_PORT}$")
    agent = only_pid(
        vm,
        f"^/opt/guestagent/bin/python3.11 {INTERPRETER_FLAGS} /opt/guestagent/bin/guestagent serve",
    )
    assert start_ticks(vm, standin) <= start_ticks(vm, agent)


def test_the_stand_in_answers_on_1024(vm: GuestVM) -> None:
    reply = vm.exec(["python3", "-c", READ_BANNER, str(INIT_AGENT_PORT)], timeout=60)
    assert reply.stdout.strip() == "standin-init-agent"


def test_the_agent_answers_on_its_own_port(vm: GuestVM) -> None:
    target = f"vsock://{LOOPBACK_CID}:{DEFAULT_VSOCK_PORT}"
    # Generous: under TCG on a busy host, guestctl's start alone (grpc import) is slow.
    result = vm.exec([GUESTCTL, "--target", target, "--json", "info"], timeout=300)
    reported = int(json.loads(result.stdout)["system"]["mem_total_bytes"])
    mem_total_kib = read_guest(vm, "/proc/meminfo").split("MemTotal:")[1].split()[0]
    assert reported == int(mem_total_kib) * 1024
    # And 1024 is not a gRPC server: guestctl gets no health answer there.
    other = f"vsock://{LOOPBACK_CID}:{INIT_AGENT_PORT}"
    assert vm.exec([GUESTCTL, "--target", other, "health"], timeout=120, check=False).rc != 0


def test_the_agent_holds_its_port_and_not_1024(vm: GuestVM) -> None:
    assert DEFAULT_VSOCK_PORT != INIT_AGENT_PORT
    log = read_guest(vm, "/var/log/guestagent.log").splitlines()
    events = [json.loads(line) for line in log if line.startswith("{")]
    (serving,) = [e for e in events if e.get("event") == "serving"]
    vsock_ports = [int(a.rsplit(":", 1)[1]) for a in serving["listen"] if a.startswith("vsock://")]
    assert vsock_ports == [DEFAULT_VSOCK_PORT]
