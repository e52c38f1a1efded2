"""`guestctl node` on a host with two sandboxes (issue 55): two QEMU guests laid out in a
temporary /run tree as Kata lays its sandboxes out, one as Kata with Cloud Hypervisor, one as
Kata with QEMU. Neither a Kata shim nor Cloud Hypervisor nor vhost-vsock runs here, so each
sandbox is stood in for (tests/standins/kata.py: the shim's monitor answering /agent-url, the
VMM's hybrid vsock carrying the agent's port to the guest; tests/standins/cloud_hypervisor.py:
Cloud Hypervisor's API driving the first guest's QEMU balloon). Kata-QEMU's shim answers
`vsock://CID:1024`, which needs vhost-vsock: its stand-in answers a hybrid vsock path instead
(the vsock:// form is the unit tests'), and its `qmp.sock` is a placeholder, as the shim holds
the real one. The daemon runs from its OCI image under podman as the DaemonSet runs it
(tests/node_image.py), the runtimes' directories mounted where the DaemonSet mounts them; the
test's policy file is mounted beside (the DaemonSet runs the defaults).

Each guest runs a workload that grows, then leaves a set cold while a hot loop keeps running.
Pass: both found; at least 80 % of each guest's cold set out of QEMU's RSS less TCG's code
within 180 s, the Cloud Hypervisor one through the balloon, the QEMU one through the guest's
reclaimer and free page reporting (the same out of QEMU's mapping of the guest's RAM is
recorded beside: QEMU's own memory grows beside it, see ram_block_rss; and where the rest
stayed, the per-CPU free lists among it); the hot loops within 1.10x, paced by a pass over
locked pages; no OOM kill; one sandbox removed mid-run dropped within 5 s, the metrics showing
two VMs, then one; SIGTERM leaves the balloon where it is."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, VMConfig, free_tcp_port
from guestagent.linux.mm import zoneinfo_sum
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.node_image import loaded_image
from tests.standins.cloud_hypervisor import CloudHypervisorStandIn
from tests.standins.kata import HybridVsock, ShimMonitor
from tests.vm import pace as pacing
from tests.vm.guest import boot_and_record, kb_field, oom_kills, wait_until
from tests.vm.node import Node
from tests.workloads.reclaim import (
    guest_free_memory,
    guest_time,
    iteration_log,
    ram_block_rss,
    slowdown,
    start_workload,
    within,
)

pytestmark = pytest.mark.vm

RESULTS: dict[str, Any] = {}
GUEST = VMConfig(memory_mib=1024, disks=(Disk("swap", 1 << 30, serial="swap0"),))
COLD_MIB, HOT_MIB = 400, 64
FALL_OF_COLD = 0.80
WITHIN_SECONDS = 180.0
HOT_BOUND = 1.10
DROPPED_WITHIN = 5.0
# The hot loop's pace before the daemon, over as long as the daemon then takes: ten
# iterations (1-2 s under TCG) made ratios of 0.92x to 1.19x from run to run (2026-12-07).
BASELINE_SECONDS = 30.0
# ... against its pace over the daemon's first two minutes: its burst (with eviction by the
# idle ages the cold sets are out in 15-30 s, the guest's one vCPU writing them to swap) and
# what following then costs. A window ending with the fall held only the burst (1.00x-1.13x
# from run to run), one of 60 s 1.08x alone and 1.12x-1.13x beside CI's other lane, whose
# guests contend for the host's caches and CPUs more than an arithmetic reference loop shows
# (2026-12-07); so each pass is paced by one over as many locked pages (tests/workloads/
# reclaim.py, WORKLOAD). The first minute's figure is recorded beside.
DURING_SECONDS = 120.0
BURST_SECONDS = 60.0
AGENT_PORT = 6464
STEPS = ("vm_inflate", "vm_deflate")
# /proc/meminfo's fields that hold the guest's used memory between them (the rest of what
# MemTotal - MemFree counts is the kernel's own, "unlisted").
MEMINFO = (
    "Cached",
    "SwapCached",
    "Slab",
    "PageTables",
    "AnonPages",
    "KernelStack",
    "Percpu",
    "Buffers",
    "VmallocUsed",
)
# ... and parts of those, recorded beside.
MEMINFO_PARTS = ("Shmem", "Mlocked", "SUnreclaim", "Unevictable")
BALLOON_SLACK = 2 * MIB  # The balloon moves in pages; QEMU reports its actual size.
# The node's policy for the run: the defaults, but memory idle for 30 s counts as cold (the
# agent's 60 s would only lengthen the run) and the balloon takes what the figure has allowed
# for 10 s; anonymous memory goes to the guests' swap.
POLICY = """
[guest]
reclaim_anon = true
hold_seconds = 10
cold_after_ms = 30000
[timeouts]
gone_seconds = 60
"""


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    """The guest of the Kata-with-Cloud-Hypervisor sandbox."""
    yield from boot_and_record(GUEST, image, tmp_path_factory, RESULTS, "node")


@pytest.fixture(scope="module")
def vm_qemu(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    """The guest of the Kata-with-QEMU sandbox."""
    with GuestVM(GUEST, image_dir=image, workdir=tmp_path_factory.mktemp("vm-qemu")) as guest:
        pacing.measure(guest)
        yield guest


@dataclass
class Sandboxes:
    """The /run tree: each sandbox's shim monitor and hybrid vsock, the first's VMM API."""

    root: Path
    parts: list[Any] = field(default_factory=list)

    def kata(self, sandbox: str, guest: GuestVM, vmm_socket: str) -> None:
        vm_dir = self.root / "run/vc/vm" / sandbox
        vsock = "clh.sock" if vmm_socket == "clh-api.sock" else "kata.hvsock"
        url = f"hvsock:///run/vc/vm/{sandbox}/{vsock}:1024"
        self.parts.append(HybridVsock(vm_dir / vsock, AGENT_PORT, guest.host_port))
        if vmm_socket == "clh-api.sock":
            stand_in = CloudHypervisorStandIn(vm_dir / vmm_socket, guest.host_qmp_path)
            self.parts.append(stand_in.__enter__())
        else:
            (vm_dir / vmm_socket).touch()  # The shim's QMP socket: never the daemon's.
        self.parts.append(
            ShimMonitor(self.root / "run/vc/sbs" / sandbox / "shim-monitor.sock", url)
        )

    def close(self) -> None:
        for part in reversed(self.parts):
            if isinstance(part, CloudHypervisorStandIn):
                part.__exit__(None, None, None)
            else:
                part.close()


def guest_rss(vm: GuestVM) -> int:
    return vm.qemu_guest_rss_bytes()


def ram_in_rss(vm: GuestVM) -> int:
    """ram_block_rss, which must find the mapping here. QEMU's own memory beside it grew
    22-31 MiB in both guests during the run, which no guest can give back."""
    ram = ram_block_rss(vm)
    assert ram is not None, "no private anonymous mapping of exactly the guest's RAM size"
    return ram


def where_the_rest_is(guest: GuestVM) -> dict[str, Any]:
    """What a guest held when the wait for its cold set ended: whether the reclaimer had
    stopped short (the workload's cgroup's memory and its reclaimer's state) or free page
    reporting had (free memory in blocks too small for it)."""
    status = guest.exec(["cat", "/sys/fs/cgroup/pod/memory.current"]).stdout.strip()
    with AgentClient(guest.agent_target) as agent:
        status_now = agent.reclaim_status()
    targets, compaction = status_now.targets, status_now.compaction
    text = guest.exec(["cat", "/proc/meminfo"]).stdout
    meminfo = {key: kb_field(text, key) for key in ("MemTotal", "MemFree", "SwapTotal", "SwapFree")}
    listed = {key: kb_field(text, key) for key in MEMINFO + MEMINFO_PARTS}
    rss, ram = guest_rss(guest), ram_in_rss(guest)
    return {
        "qemu_guest_rss_mib": round(rss / MIB, 1),
        # Of that, the guest's RAM block's and QEMU's own (its heap, TCG's other state).
        "qemu_ram_block_rss_mib": round(ram / MIB, 1),
        "qemu_own_mib": round((rss - ram) / MIB, 1),
        "guest_used_mib": round((meminfo["MemTotal"] - meminfo["MemFree"]) / MIB, 1),
        **{f"{key}_mib": round(value / MIB, 1) for key, value in listed.items()},
        "unlisted_kernel_mib": round(
            (meminfo["MemTotal"] - meminfo["MemFree"] - sum(listed[k] for k in MEMINFO)) / MIB, 1
        ),
        "pod_current_mib": round(int(status) / MIB, 1),
        "swap_used_mib": round((meminfo["SwapTotal"] - meminfo["SwapFree"]) / MIB, 1),
        **guest_free_memory(guest),
        "reclaimer": [
            f"{t.cgroup}: {pb.ReclaimState.Name(t.state)} {t.reason}; "
            f"{t.reclaimed_total_bytes // MIB} MiB reclaimed, floor "
            f"{t.effective_floor_bytes // MIB} MiB"
            for t in targets
        ],
        "compaction": f"{compaction.runs} run(s); last check: {compaction.last_decision}",
        "pcp_lists_mib": round(pcp_list_pages(guest) * 4096 / MIB, 1),
    }


def pcp_list_pages(guest: GuestVM) -> int:
    """Free pages on the per-CPU lists (zoneinfo's pagesets' "count:"): free memory that
    MemFree and buddyinfo leave out and free page reporting never sees."""
    return zoneinfo_sum(guest.exec(["cat", "/proc/zoneinfo"]).stdout, "count:")


def fall_account(node: Node) -> dict[str, Any]:
    """What a failed wait for the cold sets says: how far each fell, where the rest was, and
    the daemon's balloon steps (CI keeps the output, not the results file)."""
    return {
        **{
            key: RESULTS.get(key)
            for key in (
                "fall_fraction_of_cold",
                "rss_fall_fraction_of_cold",
                "ram_block_and_rss_every_5_s_mib",
            )
        },
        "at_start": RESULTS.get("at_start"),
        "at_fall_end": RESULTS.get("at_fall_end"),
        "balloon_steps": [
            (e.get("vm"), e.get("event"), e.get("asked"), e.get("cause"))
            for e in node.lines
            if e.get("event") in STEPS
        ],
        # The rest of the daemon's log (set-up, errors, retries), routine lines left out.
        "node_log": [
            {k: v for k, v in e.items() if k != "t"}
            for e in node.lines
            if e.get("event") not in (*STEPS, "vm_headroom")
        ][-40:],
    }


def ready(guest: GuestVM, out: str) -> Callable[[], bool]:
    """Whether the workload has touched its memory."""
    return lambda: guest.exec(["test", "-e", f"{out}/ready"], check=False).rc == 0


def logged_for(guest: GuestVM, out: str, since: float, seconds: float) -> Callable[[], bool]:
    """Whether the hot loop's log spans `seconds` of guest time from the guest time `since`."""
    return lambda: any(i.stamp >= since + seconds for i in iteration_log(guest, out))


@pytest.fixture(scope="module")
def node_image() -> Iterator[str]:
    yield from loaded_image()


@pytest.mark.usefixtures("node_image")
def test_the_node_gives_back_both_guests_cold_sets_and_drops_a_sandbox_that_goes(
    vm: GuestVM, vm_qemu: GuestVM, tmp_path: Path
) -> None:
    pace = pacing.of(vm)
    guests = {"sb-clh": vm, "sb-qemu": vm_qemu}
    kills = {name: oom_kills(guest) for name, guest in guests.items()}
    outs = {
        name: start_workload(guest, "pod", COLD_MIB + HOT_MIB, HOT_MIB, reference="locked")
        for name, guest in guests.items()
    }
    for name, guest in guests.items():
        wait_until(
            ready(guest, outs[name]), pace.scale(300), f"{name}'s workload to touch its memory"
        )
    before = {name: ram_in_rss(guest) for name, guest in guests.items()}
    before_rss = {name: guest_rss(guest) for name, guest in guests.items()}
    RESULTS["at_start"] = {n: where_the_rest_is(g) for n, g in guests.items()}
    RESULTS["before_mib"] = {name: round(rss / MIB, 1) for name, rss in before.items()}
    baseline_from = {name: guest_time(guest) for name, guest in guests.items()}
    for name, guest in guests.items():  # The hot loops' pace before the daemon.
        wait_until(
            logged_for(guest, outs[name], baseline_from[name], BASELINE_SECONDS),
            pace.scale(120),
            f"{BASELINE_SECONDS:.0f} s of hot-loop iterations in {name} before the daemon",
        )
    root = tmp_path / "host"
    sandboxes = Sandboxes(root)
    sandboxes.kata("sb-clh", vm, "clh-api.sock")
    sandboxes.kata("sb-qemu", vm_qemu, "qmp.sock")
    port = free_tcp_port()
    config = tmp_path / "node.toml"
    config.write_text(POLICY)
    during_from = {name: guest_time(guest) for name, guest in guests.items()}
    node = Node.start_image(root, config, port)
    started = time.monotonic()
    lowest, lowest_rss = dict(before), dict(before_rss)
    fell_at: dict[str, float] = {}  # Out of QEMU's RSS less TCG's code: the figure.
    ram_fell_at: dict[str, float] = {}  # Out of its mapping of the guest's RAM: sooner.
    try:
        wait_until(lambda: node.up() == set(guests), pace.scale(60), "both sandboxes served")
        RESULTS["found_after_seconds"] = round(time.monotonic() - started, 1)

        timeline: dict[str, list[tuple[float, float, float]]] = {name: [] for name in guests}
        RESULTS["ram_block_and_rss_every_5_s_mib"] = timeline

        def fallen() -> bool:
            for name, guest in guests.items():
                rss, ram = guest_rss(guest), ram_in_rss(guest)
                lowest[name] = min(lowest[name], ram)
                lowest_rss[name] = min(lowest_rss[name], rss)
                at = round(time.monotonic() - started, 1)
                if not timeline[name] or at - timeline[name][-1][0] >= 5:
                    timeline[name].append((at, round(ram / MIB, 1), round(rss / MIB, 1)))
                if before[name] - lowest[name] >= FALL_OF_COLD * COLD_MIB * MIB:
                    ram_fell_at.setdefault(name, at)
                if before_rss[name] - lowest_rss[name] >= FALL_OF_COLD * COLD_MIB * MIB:
                    fell_at.setdefault(name, at)
            return len(fell_at) == len(guests)

        timed_out = ""
        try:
            wait_until(fallen, pace.scale(WITHIN_SECONDS), "both cold sets out of QEMU's RSS", 1.0)
        except AssertionError as failed:
            timed_out = str(failed)
        RESULTS["fall_fraction_of_cold"] = {
            n: round((before[n] - lowest[n]) / (COLD_MIB * MIB), 3) for n in guests
        }
        # The same out of QEMU's whole RSS less TCG's code, QEMU's own growth counted in.
        RESULTS["rss_fall_fraction_of_cold"] = {
            n: round((before_rss[n] - lowest_rss[n]) / (COLD_MIB * MIB), 3) for n in guests
        }
        RESULTS["fell_after_seconds"] = fell_at
        RESULTS["ram_fell_after_seconds"] = ram_fell_at
        RESULTS["at_fall_end"] = {n: where_the_rest_is(g) for n, g in guests.items()}
        assert not timed_out, f"{timed_out}: {fall_account(node)}"
        for name, guest in guests.items():
            wait_until(
                logged_for(guest, outs[name], during_from[name], DURING_SECONDS),
                pace.scale(DURING_SECONDS + 60),
                f"{DURING_SECONDS:.0f} s of hot-loop iterations in {name} with the daemon",
            )
        after_until = {name: during_from[name] + DURING_SECONDS for name in guests}
        RESULTS["metrics_both"] = sorted(node.up())

        # One sandbox goes: its directory removed, as the shim removes it at the end.
        sandboxes.parts[-1].close()
        for path in sorted((root / "run/vc/sbs/sb-qemu").rglob("*"), reverse=True):
            path.unlink() if path.is_file() or path.is_socket() else path.rmdir()
        (root / "run/vc/sbs/sb-qemu").rmdir()
        gone_at = time.monotonic()
        wait_until(lambda: node.up() == {"sb-clh"}, DROPPED_WITHIN, "sb-qemu dropped", 0.1)
        RESULTS["dropped_after_seconds"] = round(time.monotonic() - gone_at, 2)
        rc = node.stop()
    finally:
        if node.process.poll() is None:
            node.kill()
        sandboxes.close()
    logs = node.lines
    RESULTS["log_events"] = sorted({str(line.get("event")) for line in logs})
    hot, counted, burst, arithmetic = {}, {}, {}, {}
    for name, guest in guests.items():
        log = iteration_log(guest, outs[name])
        off = within(log, baseline_from[name], during_from[name])
        on = within(log, during_from[name], after_until[name])
        hot[name], counted[name] = slowdown(off, on), [len(off), len(on)]
        arithmetic[name] = slowdown(off, on, arithmetic=True)
        first = within(log, during_from[name], during_from[name] + BURST_SECONDS)
        burst[name] = slowdown(off, first)
    RESULTS["hot_iterations_before_and_during"] = counted
    RESULTS["hot_slowdown_paced"] = hot
    RESULTS["hot_slowdown_paced_first_minute"] = burst
    # The same paced by the arithmetic loop, as before 2026-12-08: recorded, not bound.
    RESULTS["hot_slowdown_paced_by_arithmetic"] = arithmetic
    RESULTS["oom_kills"] = {name: oom_kills(guest) - kills[name] for name, guest in guests.items()}
    assert rc == 0 and node.events("node_stopped"), logs[-5:]
    # Left where it was: the guest reaches the last size the daemon asked for and stays
    # there (the balloon may still have been moving towards it at SIGTERM), never deflated.
    steps = [e for e in logs if e.get("vm") == "sb-clh" and e.get("event") in STEPS]
    assert steps, RESULTS
    last_asked = GUEST.memory_mib * MIB - int(steps[-1]["asked"])
    wait_until(
        lambda: abs(vm.qmp("query-balloon")["actual"] - last_asked) <= BALLOON_SLACK,
        pace.scale(60),
        f"the balloon at the daemon's last ask ({last_asked} bytes of guest memory)",
    )
    assert set(fell_at) == set(guests), RESULTS
    assert all(v <= HOT_BOUND for v in hot.values()), RESULTS
    assert all(v == 0 for v in RESULTS["oom_kills"].values()), RESULTS
    assert [e["vm"] for e in node.events("vm_dropped")] == ["sb-qemu"], RESULTS
    assert not [line for line in logs if line.get("event") == "not_json"], logs
