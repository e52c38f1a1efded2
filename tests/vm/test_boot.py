"""The booted guest provides what the agent relies on, and the harness can observe it."""

import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from guestagent.vm.qemu import GuestVM
from tests.vm.guest import wait_until
from tests.vm.pace import Pace

pytestmark = pytest.mark.vm


def block_device_with_serial(vm: GuestVM, serial: str) -> str:
    # grep -H prints "/sys/block/vdb/serial:swap0"; disks without a serial print nothing.
    for line in vm.exec("grep -H . /sys/block/vd*/serial").stdout.splitlines():
        path, _, value = line.partition(":")
        if value == serial:
            return path.split("/")[3]
    raise AssertionError(f"no /sys/block/vd* with serial {serial}")


def test_guest_boots_and_init_starts_agent(vm: GuestVM) -> None:
    assert vm.boot_seconds is not None
    assert "guestagent-init: starting guestagent serve" in vm.console_log()


def test_exec_reads_meminfo(vm: GuestVM) -> None:
    meminfo = vm.exec(["cat", "/proc/meminfo"]).stdout
    total_kib = int(meminfo.split("MemTotal:")[1].split()[0])
    assert 256 * 1024 < total_kib <= 512 * 1024


def test_exec_reports_failure_and_stdin(vm: GuestVM) -> None:
    assert vm.exec("exit 3", check=False).rc == 3
    assert vm.exec(["cat"], stdin="hello").stdout == "hello"
    assert vm.exec("sleep 30", timeout=1, check=False).timed_out


def test_cgroup2_delegates_memory_controller(vm: GuestVM) -> None:
    mounts = vm.exec(["cat", "/proc/self/mounts"]).stdout
    assert any(line.split()[1:3] == ["/sys/fs/cgroup", "cgroup2"] for line in mounts.splitlines())
    assert "memory" in vm.exec(["cat", "/sys/fs/cgroup/cgroup.subtree_control"]).stdout.split()


def test_init_turns_on_the_multigen_lru(vm: GuestVM) -> None:
    # Bit 0 is the core (Documentation/admin-guide/mm/multigen_lru.rst); "y" sets every bit
    # the CPU supports.
    assert int(vm.exec(["cat", "/sys/kernel/mm/lru_gen/enabled"]).stdout, 16) & 1


def test_memory_pressure_is_reported(vm: GuestVM) -> None:
    assert vm.exec(["cat", "/proc/pressure/memory"]).stdout.startswith("some avg10=")


def test_swap_disk_has_udev_serial(vm: GuestVM) -> None:
    device = block_device_with_serial(vm, "swap0")
    properties = vm.exec(["udevadm", "info", "--query=property", f"/dev/{device}"]).stdout
    assert "ID_SERIAL=swap0" in properties.splitlines()


def test_swap_disk_claims_to_be_rotational(vm: GuestVM) -> None:
    # virtio-blk reports rotational=1 by default; the agent is the one that corrects it.
    device = block_device_with_serial(vm, "swap0")
    assert vm.exec(["cat", f"/sys/block/{device}/queue/rotational"]).stdout.strip() == "1"


def test_vsock_loopback_connects_in_guest(vm: GuestVM) -> None:
    assert vm.exec(["test", "-d", "/sys/module/vsock_loopback"], check=False).rc == 0
    # CID 1 is VMADDR_CID_LOCAL (not exported by Python 3.11), served by vsock_loopback.
    echo_over_vsock = (
        "import socket\n"
        "server = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n"
        "server.bind((1, 5555)); server.listen()\n"
        "client = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n"
        "client.connect((1, 5555)); client.sendall(b'ping')\n"
        "print(server.accept()[0].recv(4).decode())\n"
    )
    assert vm.exec(["python3", "-c", echo_over_vsock]).stdout.strip() == "ping"


def test_kernel_leaves_hot_added_memory_offline(vm: GuestVM) -> None:
    # Onlining is the agent's job (test_giveback shows it doing so); the kernel must not.
    assert vm.exec(["cat", "/sys/devices/system/memory/auto_online_blocks"]).stdout.strip() == (
        "offline"
    )


def test_host_sees_qemu_rss_and_sparse_disk(vm: GuestVM) -> None:
    assert vm.qemu_rss_bytes() > 64 << 20
    assert vm.disk_allocated_bytes("swap") < 1 << 20
    device = block_device_with_serial(vm, "data0")
    vm.exec(["dd", "if=/dev/urandom", f"of=/dev/{device}", "bs=1M", "count=8", "oflag=direct"])
    assert vm.disk_allocated_bytes("data") >= 8 << 20


def test_balloon_inflates_on_request(vm: GuestVM, pace: Pace) -> None:
    summary = vm.qmp("query-memory-size-summary")
    full = summary["base-memory"] + summary.get("plugged-memory", 0)
    assert vm.qmp("query-balloon")["actual"] == full
    target = full - (128 << 20)
    vm.balloon(target)
    try:
        wait_until(
            lambda: vm.qmp("query-balloon")["actual"] == target,
            pace.scale(60),
            f"the guest to inflate the balloon by 128 MiB to {target} bytes",
        )
    finally:
        vm.balloon(full)


def test_agent_answers_grpc_health_check(vm: GuestVM, pace: Pace) -> None:
    host, port = vm.agent_target.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5):
        pass
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(), timeout=pace.scale(30))
    assert response.status == health_pb2.HealthCheckResponse.SERVING
