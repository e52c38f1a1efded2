"""A VMM under its pod's memory limit (issue 55): QEMU starts in a host memory cgroup whose
limit is below the guest's RAM plus QEMU's own, as a Cloud Hypervisor worker pod's guest RAM is
charged to its pod. In the guest a set is touched and left cold, then a second set grows: all
the guest ever touched exceeds the limit, what it uses at once fits. Two such guests run side
by side: the node daemon serves one (declared, with its QMP socket), and the other runs without
it, to say what happens then.

Pass: with the daemon, QEMU is not OOM-killed and its anonymous memory stays under the limit
by the margin's half at most; without, whatever happens is recorded (tests/vm/results/
node_cgroup.json). Under TCG, QEMU's translation cache is QEMU's own anonymous memory and
would weigh more than the guest, so it is capped (tb-size 64 MiB): the limit then weighs the
guest, as it does under KVM."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from guestagent.host.sizing.boot import Disk, VMConfig, free_tcp_port
from guestagent.sizes import MIB
from guestagent.vm.qemu import GuestVM
from tests.vm import pace as pacing
from tests.vm.guest import (
    boot_and_record,
    filler_ready,
    make_cgroup,
    start_filler,
    wait_until,
    wait_until_steady,
)
from tests.vm.node import Node

pytestmark = pytest.mark.vm

RESULTS: dict[str, Any] = {}
SET_MIB = 350
# The limit over QEMU's memory after boot: room for one set and the guest's own growth, not
# for both sets.
ROOM_MIB = 500
MARGIN_MIB = 128
TB_MIB = 64


@dataclass
class HostCgroup:
    """A host memory cgroup: cgroup v2's where the unified hierarchy has the memory controller,
    else v1's memory controller (this CI host's hybrid layout)."""

    directory: Path
    v2: bool

    @classmethod
    def make(cls) -> HostCgroup:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        paths = {line.split(":")[1]: line.split(":", 2)[2] for line in lines}
        name = f"guestagent-node-test-{uuid.uuid4().hex[:8]}"
        unified = Path("/sys/fs/cgroup") / paths.get("", "/").lstrip("/")
        if (unified / "memory.current").exists() or Path("/sys/fs/cgroup/memory.stat").exists():
            directory = unified.parent / name if unified.name else unified / name
            directory.mkdir()
            return cls(directory, True)
        v1 = Path("/sys/fs/cgroup/memory") / paths["memory"].lstrip("/") / name
        v1.mkdir()
        return cls(v1, False)

    def set_limit(self, limit: int) -> None:
        (self.directory / ("memory.max" if self.v2 else "memory.limit_in_bytes")).write_text(
            str(limit)
        )

    def limit(self) -> int:
        return int(
            (self.directory / ("memory.max" if self.v2 else "memory.limit_in_bytes")).read_text()
        )

    def anon(self) -> int:
        """Anonymous memory charged here (QEMU's guest RAM and its own heap)."""
        stat = dict(
            line.split() for line in (self.directory / "memory.stat").read_text().splitlines()
        )
        return int(stat["anon"] if self.v2 else stat["total_rss"])

    def oom_kills(self) -> int:
        if self.v2:
            events = dict(
                line.split() for line in (self.directory / "memory.events").read_text().splitlines()
            )
            return int(events.get("oom_kill", 0))
        control = dict(
            line.split()
            for line in (self.directory / "memory.oom_control").read_text().splitlines()
        )
        return int(control.get("oom_kill", 0))

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.directory.rmdir()


def guest(cgroup: HostCgroup) -> VMConfig:
    return VMConfig(
        memory_mib=1024,
        disks=(Disk("swap", 1 << 30, serial="swap0"),),
        tcg_tb_mib=TB_MIB,
        host_cgroup=str(cgroup.directory),
    )


@pytest.fixture(scope="module")
def cgroups() -> Iterator[tuple[HostCgroup, HostCgroup]]:
    served, alone = HostCgroup.make(), HostCgroup.make()
    yield served, alone
    served.remove()
    alone.remove()


@pytest.fixture(scope="module")
def vm(
    image: Path, tmp_path_factory: pytest.TempPathFactory, cgroups: tuple[HostCgroup, HostCgroup]
) -> Iterator[GuestVM]:
    """The guest the daemon serves."""
    yield from boot_and_record(guest(cgroups[0]), image, tmp_path_factory, RESULTS, "node_cgroup")


@pytest.fixture(scope="module")
def vm_alone(
    image: Path, tmp_path_factory: pytest.TempPathFactory, cgroups: tuple[HostCgroup, HostCgroup]
) -> Iterator[GuestVM]:
    """The guest without the daemon."""
    with GuestVM(
        guest(cgroups[1]), image_dir=image, workdir=tmp_path_factory.mktemp("alone")
    ) as vm:
        pacing.measure(vm)
        yield vm


class Peaks:
    """Each cgroup's anonymous memory, its highest, on a host thread every half second."""

    def __init__(self, cgroups: dict[str, HostCgroup]) -> None:
        self.cgroups = cgroups
        self.peaks = {name: 0 for name in cgroups}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            for name, cgroup in self.cgroups.items():
                with contextlib.suppress(OSError, KeyError):
                    self.peaks[name] = max(self.peaks[name], cgroup.anon())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def touched_or_gone(guest_vm: GuestVM, marker: str) -> Callable[[], bool]:
    """The set touched, or QEMU gone (killed by the host's OOM killer)."""
    return lambda: not guest_vm.running or filler_ready(guest_vm, marker)


def test_the_node_keeps_a_vmm_under_its_pods_limit(
    vm: GuestVM, vm_alone: GuestVM, cgroups: tuple[HostCgroup, HostCgroup], tmp_path: Path
) -> None:
    pace = pacing.of(vm)
    pairs = {"served": (vm, cgroups[0]), "alone": (vm_alone, cgroups[1])}
    for name, (_, cgroup) in pairs.items():
        booted = cgroup.anon()
        cgroup.set_limit(booted + ROOM_MIB * MIB)
        RESULTS[name] = {"limit_mib": cgroup.limit() // MIB, "anon_after_boot_mib": booted // MIB}
    # Swap in the guest without the daemon too, so that the two differ by the daemon alone.
    swap = "$(readlink -f /dev/disk/by-id/virtio-swap0)"
    vm_alone.exec(f"sh -c 'mkswap {swap} >/dev/null && swapon {swap}'")
    declared = tmp_path / "vms.toml"
    declared.write_text(
        f'[[vm]]\nid = "pod-vm"\nagent = "{vm.agent_target}"\nvmm = "qemu"\n'
        f'api = "{vm.host_qmp_path}"\n'
    )
    port = free_tcp_port()
    config = tmp_path / "node.toml"
    config.write_text(
        f'[discovery]\nkata = false\nfirecracker_containerd = false\ndeclared = "{declared}"\n'
        f"[guest]\nreclaim_anon = true\nhold_seconds = 10\ncold_after_ms = 30000\n"
        f'[host]\ncgroup_margin = "{MARGIN_MIB}Mi"\n'
        f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
    )
    node = Node.start(config, port)
    peaks = Peaks({name: cgroup for name, (_, cgroup) in pairs.items()})
    served = cgroups[0]
    try:
        wait_until(lambda: node.up() == {"pod-vm"}, pace.scale(60), "the VM served")
        wait_until(
            lambda: len(node.events("vm_set_up")) >= 2, pace.scale(60), "swap and the reclaimer on"
        )
        firsts = {}
        for name, (guest_vm, _) in pairs.items():
            make_cgroup(guest_vm, "first")
            firsts[name] = start_filler(guest_vm, "first", SET_MIB, name="first")
        for name, (guest_vm, _) in pairs.items():
            wait_until(touched_or_gone(guest_vm, firsts[name]), pace.scale(300), f"{name}: set 1")
        # The first set goes cold; the daemon's guest reclaims it and the balloon takes it.
        started = time.monotonic()
        wait_until(
            lambda: served.anon() < served.limit() - (SET_MIB + MARGIN_MIB // 2) * MIB,
            pace.scale(240),
            "the served guest's cold set given back",
            1.0,
        )
        RESULTS["served"]["set_1_given_back_after_seconds"] = round(time.monotonic() - started, 1)
        seconds = {}
        for name, (guest_vm, _) in pairs.items():
            if guest_vm.running:
                make_cgroup(guest_vm, "second")
                seconds[name] = start_filler(guest_vm, "second", SET_MIB, name="second")
        for name, (guest_vm, _) in pairs.items():
            if name in seconds:
                wait_until(
                    touched_or_gone(guest_vm, seconds[name]), pace.scale(300), f"{name}: set 2"
                )
        wait_until_steady(served.anon, pace.scale(120), "the served guest's memory", 8 * MIB, 5.0)
    finally:
        node.stop()
        peaks.stop()
    for name, (guest_vm, cgroup) in pairs.items():
        RESULTS[name].update(
            qemu_running=guest_vm.running,
            oom_kills=cgroup.oom_kills(),
            peak_anon_mib=peaks.peaks[name] // MIB,
        )
    RESULTS["node_events"] = sorted({str(line.get("event")) for line in node.lines})
    result = RESULTS["served"]
    assert result["qemu_running"] and result["oom_kills"] == 0, RESULTS
    assert result["peak_anon_mib"] < result["limit_mib"], RESULTS
