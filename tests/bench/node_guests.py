"""The node daemon against two guests (issue 55's bench): the host's RSS for both QEMUs over
time, first with free page reporting alone (what a node has without this daemon), then with
the daemon serving both guests as declared VMs (each QEMU with its own QMP, so the daemon
follows the balloon too). Each arm starts, in each guest and a top-level cgroup of its own,
400 MiB touched once and a 64 MiB hot loop; once both have touched their memory, the arm's
action (nothing, or the daemon's start) is t = 0 and the host samples QEMU's RSS (without
TCG's code) every second for WATCH_S. The ratio is the node's RSS at the end with the daemon
over the same without it. The daemon runs from this checkout: what is measured is what it
does to the guests, not its own footprint (the scale bench's, from the image).
`python -m tests.bench.node_guests --out FILE.json` runs it alone; the plot lands beside."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from guestagent.host.sizing.boot import Disk, VMConfig, free_tcp_port
from guestagent.sizes import MIB
from guestagent.vm.qemu import GuestVM
from tests.bench import alone
from tests.bench.plotting import rss_timelines
from tests.bench.vm import booted
from tests.vm.guest import oom_kills
from tests.vm.node import Node
from tests.workloads.reclaim import (
    guest_time,
    iteration_log,
    slowdown,
    start_workload,
    stop_workload,
    within,
)

GUEST = VMConfig(memory_mib=1024, disks=(Disk("swap", 1 << 30, serial="swap0"),))
GUESTS = ("vm-a", "vm-b")
COLD_MIB, HOT_MIB = 400, 64
WATCH_S = 180.0
LAST_S = 30.0  # The end's window: the node's RSS averaged over its last seconds.
# As the two-sandbox VM test's: memory idle 30 s is cold, the balloon takes what the figure
# has allowed for 10 s, anonymous memory goes to the guests' swap.
POLICY = """
[discovery]
kata = false
firecracker_containerd = false
declared = "{declared}"
[guest]
reclaim_anon = true
hold_seconds = 10
cold_after_ms = 30000
[metrics]
listen = "127.0.0.1:{port}"
"""
ARMS = (("reporting_alone", "free page reporting alone"), ("daemon", "guestctl node"))


class NodeSampler:
    """Both QEMUs' RSS less TCG's code, once a second, on a host thread."""

    def __init__(self, guests: dict[str, GuestVM]) -> None:
        self.guests = guests
        self.rows: list[dict[str, float]] = []
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> NodeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            row = {name: vm.qemu_guest_rss_bytes() / MIB for name, vm in self.guests.items()}
            row["t"] = time.monotonic() - self.started
            self.rows.append(row)
            self._stop.wait(1.0)

    def now(self) -> float:
        return time.monotonic() - self.started


def node_mib(row: dict[str, float]) -> float:
    return sum(row[name] for name in GUESTS)


def arm(
    guests: dict[str, GuestVM], cgroup: str, act: Callable[[], Any], end: Callable[[], Any]
) -> dict[str, Any]:
    kills = {name: oom_kills(vm) for name, vm in guests.items()}
    with NodeSampler(guests) as sampler:
        outs = {
            name: start_workload(vm, cgroup, COLD_MIB + HOT_MIB, HOT_MIB)
            for name, vm in guests.items()
        }
        acted_at = sampler.now()
        since = {name: guest_time(vm) for name, vm in guests.items()}
        detail = act()
        time.sleep(max(0.0, WATCH_S - (sampler.now() - acted_at)))
        until = {name: guest_time(vm) for name, vm in guests.items()}
        detail = {"act": detail, "end": end()}
        logs = {name: iteration_log(vm, outs[name]) for name, vm in guests.items()}
        for name, vm in guests.items():
            stop_workload(vm, outs[name])
    rows = sampler.rows
    at_action = [r for r in rows if r["t"] <= acted_at][-1]
    watched = [r for r in rows if acted_at <= r["t"] <= acted_at + WATCH_S]
    last = [r for r in watched if r["t"] >= acted_at + WATCH_S - LAST_S]
    end_mib = sum(node_mib(r) for r in last) / len(last)
    return {
        "node_rss_at_action_mib": round(node_mib(at_action), 1),
        "node_rss_end_mib": round(end_mib, 1),
        "given_back_mib": {
            name: round(at_action[name] - sum(r[name] for r in last) / len(last), 1)
            for name in GUESTS
        },
        "oom_kills": {name: oom_kills(vm) - kills[name] for name, vm in guests.items()},
        "hot_windows": {name: within(logs[name], since[name], until[name]) for name in GUESTS},
        "hot_last_minute": {
            name: within(logs[name], until[name] - 60, until[name]) for name in GUESTS
        },
        "detail": detail,
        "rss_timeline": [(round(r["t"] - acted_at, 1), round(node_mib(r), 1)) for r in rows],
    }


@contextmanager
def two_guests() -> Iterator[dict[str, GuestVM]]:
    with ExitStack() as stack:
        guests = {}
        for name in GUESTS:
            vm, _agent = stack.enter_context(booted(GUEST))
            guests[name] = vm
        yield guests


def measure_node_guests(plot_path: Path | None) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="node-guests-"))
    results: dict[str, Any] = {}
    with two_guests() as guests, ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, workdir, ignore_errors=True)
        declared = workdir / "vms.toml"
        declared.write_text(
            "".join(
                f'[[vm]]\nid = "{name}"\nagent = "{vm.agent_target}"\n'
                f'vmm = "qemu"\napi = "{vm.host_qmp_path}"\n'
                for name, vm in guests.items()
            )
        )
        port = free_tcp_port()
        config = workdir / "node.toml"
        config.write_text(POLICY.format(declared=declared, port=port))
        daemon: list[Node] = []

        def start() -> str:
            daemon.append(Node.start(config, port))
            cleanup.callback(daemon[0].kill)  # After a failed arm; stop() ran otherwise.
            return "started"

        def stop() -> dict[str, Any]:
            node = daemon[0]
            served = sorted(node.up())
            rc = node.stop()
            events: dict[str, int] = {}
            for line in node.lines:
                events[str(line.get("event"))] = events.get(str(line.get("event")), 0) + 1
            steps = [
                f"{line['vm']} {line['event'][3:]} to {int(line['asked']) // MIB} MiB: "
                f"{line.get('cause')}"
                for line in node.lines
                if line.get("event") in ("vm_inflate", "vm_deflate")
            ]
            return {"served": served, "exit": rc, "log_events": events, "balloon_steps": steps}

        results["reporting_alone"] = arm(guests, "pod-alone", lambda: None, lambda: None)
        results["daemon"] = arm(guests, "pod-node", start, stop)
    alone_end = results["reporting_alone"]["node_rss_end_mib"]
    with_end = results["daemon"]["node_rss_end_mib"]
    alone_arm, daemon_arm = results["reporting_alone"], results["daemon"]
    hot = {
        name: {
            "whole_watch": slowdown(
                alone_arm["hot_windows"][name], daemon_arm["hot_windows"][name]
            ),
            # Once the cold sets are out: what following and the reclaimer cost at rest.
            "last_minute": slowdown(
                alone_arm["hot_last_minute"][name], daemon_arm["hot_last_minute"][name]
            ),
        }
        for name in GUESTS
    }
    figures: dict[str, Any] = {
        "guests": len(GUESTS),
        "guest_memory_mib": GUEST.memory_mib,
        "cold_mib": COLD_MIB,
        "hot_mib": HOT_MIB,
        "watch_s": WATCH_S,
        "end_window_s": LAST_S,
        **results,
        "node_rss_end_ratio_daemon_over_alone": round(with_end / alone_end, 3),
        "hot_slowdown_paced_daemon_over_alone": hot,
    }
    if plot_path is not None:
        figures["plot"] = plot(figures, plot_path)
    for side, _ in ARMS:
        figures[side] = {
            k: v
            for k, v in figures[side].items()
            if k not in ("rss_timeline", "hot_windows", "hot_last_minute")
        }
    return figures


def plot(figures: dict[str, Any], path: Path) -> str:
    lines = [
        (
            f"{label} ({sum(figures[side]['oom_kills'].values())} OOM kills)",
            figures[side]["rss_timeline"],
        )
        for side, label in ARMS
    ]
    return rss_timelines(
        lines,
        path,
        f"Two guests, each {COLD_MIB} MiB cold and {HOT_MIB} MiB hot: the node's RSS",
        xlabel="seconds from the action (both workloads ready; the daemon starts)",
    )


def main() -> int:
    args = alone.parser(__doc__, "node_guests").parse_args()
    return alone.write(args.out, measure_node_guests(args.out.with_suffix(".png")))


if __name__ == "__main__":
    raise SystemExit(main())
