"""The bundle on a systemd guest: systemd is PID 1, the agent is the hardened
guestagent.service, as it would run in a Kata guest image. The unit comes up and serves, its
hardening leaves swap, limits, compaction and hot-plug onlining working, it runs in its own
bounded cgroup, and `systemctl stop` ends it with a clean SIGTERM exit."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import FLAVOURS, VMConfig
from guestagent.ops.self_cgroup import MEMORY_HIGH, MEMORY_MIN
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.conftest import SWAP_DISK
from tests.vm.guest import boot_and_record, plug_dimm_and_wait_online, read_guest

pytestmark = pytest.mark.vm

UNIT = "guestagent.service"
UNIT_CGROUP = "/system.slice/guestagent.service"
# The unit's MemoryMin= and MemoryHigh=, the agent's own bounds, and no MemoryMax=.
UNIT_MEMORY = {"memory.min": str(MEMORY_MIN), "memory.high": str(MEMORY_HIGH), "memory.max": "max"}
# CapabilityBoundingSet=CAP_SYS_ADMIN CAP_DAC_OVERRIDE CAP_NET_ADMIN CAP_IPC_LOCK (capability
# numbers 21, 1, 12 and 14).
UNIT_CAPABILITIES = (1 << 21) | (1 << 1) | (1 << 12) | (1 << 14)
RESULTS: dict[str, object] = {}


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    rootfs = image / FLAVOURS["systemd"].rootfs
    if not rootfs.is_file():
        reason = f"no systemd image {rootfs} (make image)"
        if os.environ.get("GUESTAGENT_VM_TESTS") == "required":
            pytest.fail(reason)
        pytest.skip(reason)
    config = VMConfig(flavour="systemd", slots=2, maxmem_mib=1024, disks=(SWAP_DISK,))
    yield from boot_and_record(config, image, tmp_path_factory, RESULTS, "systemd")


def unit_property(vm: GuestVM, name: str) -> str:
    return vm.exec(["systemctl", "show", "--value", "-p", name, UNIT]).stdout.strip()


def main_pid(vm: GuestVM) -> int:
    pid = int(unit_property(vm, "MainPID"))
    assert pid > 0, "guestagent.service has no main process"
    return pid


def status_field(vm: GuestVM, pid: int, field: str) -> str:
    for line in read_guest(vm, f"/proc/{pid}/status").splitlines():
        if line.startswith(f"{field}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_unit_is_active_and_guestctl_reaches_it(vm: GuestVM) -> None:
    assert vm.exec(["systemctl", "is-active", UNIT]).stdout.strip() == "active"
    host_guestctl = [sys.executable, "-c", "from guestagent.host.ctl import main; main()"]
    result = subprocess.run(
        [*host_guestctl, "--target", vm.agent_target, "--json", "info"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    reported = int(json.loads(result.stdout)["system"]["mem_total_bytes"])
    mem_total_kib = read_guest(vm, "/proc/meminfo").split("MemTotal:")[1].split()[0]
    assert reported == int(mem_total_kib) * 1024


def test_agent_runs_in_its_own_bounded_cgroup(vm: GuestVM) -> None:
    pid = main_pid(vm)
    assert read_guest(vm, f"/proc/{pid}/cgroup").strip() == f"0::{UNIT_CGROUP}"
    cgroup = f"/sys/fs/cgroup{UNIT_CGROUP}"
    for name, value in UNIT_MEMORY.items():
        assert read_guest(vm, f"{cgroup}/{name}").strip() == value, name
    RESULTS["agent_rss_mib"] = round(int(status_field(vm, pid, "VmRSS").split()[0]) / 1024, 1)
    RESULTS["unit_memory_current_mib"] = round(
        int(read_guest(vm, f"{cgroup}/memory.current")) / MIB, 1
    )


def test_the_bundles_tmpfiles_line_turns_on_the_multigen_lru(vm: GuestVM) -> None:
    assert read_guest(vm, "/etc/tmpfiles.d/guestagent.conf").count("lru_gen/enabled") == 1
    assert int(read_guest(vm, "/sys/kernel/mm/lru_gen/enabled"), 16) & 1  # The core is on.


def test_unit_hardening_is_in_effect(vm: GuestVM) -> None:
    pid = main_pid(vm)
    assert int(status_field(vm, pid, "CapBnd"), 16) == UNIT_CAPABILITIES
    assert status_field(vm, pid, "NoNewPrivs") == "1"
    assert status_field(vm, pid, "Seccomp") == "2"  # SystemCallFilter: a filter is installed.
    assert read_guest(vm, f"/proc/{pid}/oom_score_adj").strip() == "-1000"
    # CAP_IPC_LOCK: it locked its pages (mlockall), past the unit's RLIMIT_MEMLOCK.
    assert int(status_field(vm, pid, "VmLck").split()[0]) > 4096, status_field(vm, pid, "VmLck")
    # ProtectSystem=strict: /usr is read-only in the agent's mount namespace, not in the guest's.
    probe = vm.exec(["nsenter", "-t", str(pid), "-m", "touch", "/usr/probe"], check=False)
    assert probe.rc != 0 and "Read-only file system" in probe.stderr, probe
    assert vm.exec(["touch", "/usr/probe"], check=False).rc == 0


def test_delay_accounting_works_under_the_hardening(vm: GuestVM, agent: AgentClient) -> None:
    """The unit lets the agent turn delay accounting on and ask taskstats for it (CAP_NET_ADMIN),
    and turn the multi-gen LRU on, as it does on a guest the bundle is added to."""
    assert read_guest(vm, "/proc/sys/kernel/task_delayacct").strip() == "1"
    assert int(read_guest(vm, "/sys/kernel/mm/lru_gen/enabled").strip(), 16) & 1
    absent = {a.feature: a.reason for a in agent.info().absent}
    assert "delayacct" not in absent, absent


def test_swap_limits_and_compaction_work_under_the_hardening(
    vm: GuestVM, agent: AgentClient
) -> None:
    area = agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
    assert area.size_bytes > 0
    swaps = read_guest(vm, "/proc/swaps")
    assert area.device in swaps, swaps
    # /run/guestagent is the unit's RuntimeDirectory, the one place it may write below /run.
    assert vm.exec(["test", "-s", "/run/guestagent/swaps.json"], check=False).rc == 0
    applied = agent.set_limits(
        "pod/ctr", pb.LinuxMemory(limit=64 * MIB, swap=128 * MIB, reservation=16 * MIB), create=True
    )
    assert applied.created
    assert read_guest(vm, "/sys/fs/cgroup/pod/ctr/memory.max").strip() == str(64 * MIB)
    assert read_guest(vm, "/sys/fs/cgroup/pod/ctr/memory.swap.max").strip() == str(64 * MIB)
    assert read_guest(vm, "/sys/fs/cgroup/pod/ctr/memory.low").strip() == str(16 * MIB)
    # Compact writes /proc/sys/vm/compact_memory; a refused write would be an error here.
    assert agent.compact().duration_us > 0


def test_hot_plugged_memory_is_onlined(vm: GuestVM, agent: AgentClient) -> None:
    before, grown = plug_dimm_and_wait_online(vm, agent, 256)
    # The agent onlined it (nothing else in this guest does: the kernel leaves it offline).
    journal = vm.exec(["journalctl", "-u", UNIT, "-o", "cat", "--no-pager"]).stdout
    assert '"event": "memory_onlined"' in journal
    RESULTS["hotplug_mem_total_mib"] = [before // MIB, grown // MIB]


def test_systemctl_stop_is_a_clean_sigterm_exit(vm: GuestVM) -> None:
    pid = main_pid(vm)
    vm.exec(["systemctl", "stop", UNIT], timeout=120)
    assert vm.exec(["test", "-d", f"/proc/{pid}"], check=False).rc != 0
    # CLD_EXITED (1) with status 0: it exited by itself on SIGTERM, it was not killed.
    assert unit_property(vm, "Result") == "success"
    assert unit_property(vm, "ExecMainCode") == "1"
    assert unit_property(vm, "ExecMainStatus") == "0"
    journal = vm.exec(["journalctl", "-u", UNIT, "-o", "cat", "--no-pager"]).stdout
    assert "Traceback" not in journal
    assert '"event": "stopped"' in journal
    # RuntimeDirectoryPreserve=yes: the swap policy outlives the agent, as docs/guest-image.md says.
    assert vm.exec(["test", "-s", "/run/guestagent/swaps.json"], check=False).rc == 0
