"""The node daemon's bench (issue 55): at scale (50 declared VMs whose agents run over fake
roots on this host: every one served, the daemon's RSS and idle CPU), the daemon run from its
OCI image as the DaemonSet runs it when the image is built (`make node-image`), else from this
checkout; and against two guests (the host's RSS over time with free page reporting alone,
then with the daemon)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guestagent.host.sizing.boot import free_tcp_port
from tests.fakes.agentproc import AgentProcess
from tests.fakes.root import make_fake_root

IMAGE = Path(__file__).resolve().parents[2] / "image" / "build" / "guestagent-node.oci"
SCALE_VMS = 50
RSS_TARGET_MIB = 40.0
CPU_TARGET = 0.01  # Of one core, while idle.
TICKS = os.sysconf("SC_CLK_TCK")


def start_node(config: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "guestagent.host.ctl", "node", "--config", str(config)]
    return subprocess.Popen(command, stderr=subprocess.DEVNULL, text=True)


@dataclass
class Daemon:
    """The daemon under measure: its process (podman's, for the image) and its own pid."""

    process: subprocess.Popen[str]
    pid: Callable[[], int]
    stop: Callable[[], None]
    how: str


def native(config: Path, workdir: Path, port: int) -> Daemon:
    process = start_node(config)

    def stop() -> None:
        process.send_signal(signal.SIGTERM)
        process.wait(30)

    return Daemon(process, lambda: process.pid, stop, "this checkout's python")


def from_image(config: Path, workdir: Path, port: int) -> Daemon:
    """As the DaemonSet runs it (tests/node_image.py), the VMs' sockets and the policy mounted
    where they are."""
    from tests.node_image import daemonset_command, podman

    name = f"guestagent-node-bench-{os.getpid()}"
    host = workdir / "host"
    (host / "run/containerd").mkdir(parents=True)  # The CRI's, which the DaemonSet mounts.
    command = daemonset_command(
        name, host, port, f"{workdir}:{workdir}:ro", args=("--config", str(config))
    )
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
    )

    def pid() -> int:
        return int(podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip())

    def stop() -> None:
        podman("stop", "--time=30", name, check=False)
        process.wait(60)

    return Daemon(process, pid, stop, "the node image under podman (runc)")


def launcher() -> Callable[[Path, Path, int], Daemon]:
    if IMAGE.exists() and shutil.which("podman") and os.geteuid() == 0:
        from tests.node_image import loaded_image

        next(loaded_image())  # Loaded into podman's storage (left there for the runs).
        return from_image
    return native


def metrics(port: int) -> dict[str, float]:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    except OSError:
        return {}
    samples = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def up_count(port: int) -> int:
    return sum(1 for k, v in metrics(port).items() if k.startswith("guestagent_node_vm_up{") and v)


def rss_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "Threads"):
            fields[key] = int(value.split()[0])
    return fields


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / TICKS  # utime, stime


def measure_node_scale(count: int = SCALE_VMS, idle_seconds: float = 60.0) -> dict[str, Any]:
    """`count` agents on fake roots, declared; the daemon serves each, then idles."""
    workdir = Path(tempfile.mkdtemp(prefix="node-scale-"))
    agents: list[AgentProcess] = []
    node: Daemon | None = None
    try:
        for number in range(count):
            directory = workdir / f"vm{number}"
            directory.mkdir()
            agent = AgentProcess(make_fake_root(directory / "root").root, directory)
            agent.start()
            agents.append(agent)
        declared = workdir / "vms.toml"
        declared.write_text(
            "".join(
                f'[[vm]]\nid = "vm{n}"\nagent = "{a.unix_target}"\n' for n, a in enumerate(agents)
            )
        )
        port = free_tcp_port()
        config = workdir / "node.toml"
        config.write_text(
            f'[discovery]\nkata = false\nfirecracker_containerd = false\ndeclared = "{declared}"\n'
            f'[guest]\nswap_serial = ""\n[metrics]\nlisten = "127.0.0.1:{port}"\n'
        )
        started = time.monotonic()
        node = launcher()(config, workdir, port)
        while up_count(port) < count:
            if time.monotonic() - started > 120 or node.process.poll() is not None:
                raise RuntimeError(f"{up_count(port)} of {count} VMs served after 120 s")
            time.sleep(0.5)
        served_after = time.monotonic() - started
        pid = node.pid()
        settle = time.monotonic() + 10  # Each loop's setup calls and first reports done.
        while time.monotonic() < settle:
            time.sleep(1)
        memory_served = rss_kib(pid)
        cpu_before, at = cpu_seconds(pid), time.monotonic()
        deadline = at + idle_seconds
        while time.monotonic() < deadline:
            time.sleep(1)
        cpu = (cpu_seconds(pid) - cpu_before) / (time.monotonic() - at)
        memory_idle = rss_kib(pid)
        served_at_end = up_count(port)
    finally:
        if node is not None:
            node.stop()
        for agent in agents:
            agent.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    rss_mib = memory_idle["VmRSS"] / 1024
    return {
        "daemon": node.how,
        "vms": count,
        "all_served_after_seconds": round(served_after, 1),
        "served_at_end": served_at_end,
        "daemon_after_serving_kib": memory_served,
        "daemon_after_idle_kib": memory_idle,
        "idle_seconds": idle_seconds,
        "idle_cpu_share_of_a_core": round(cpu, 4),
        "targets": {
            "all_served": served_at_end == count,
            "rss_at_most_40_mib": {"value": round(rss_mib, 1), "met": rss_mib <= RSS_TARGET_MIB},
            "idle_cpu_at_most_1_percent": {"value": round(cpu, 4), "met": cpu <= CPU_TARGET},
        },
    }


if __name__ == "__main__":
    print(
        json.dumps(
            measure_node_scale(int(sys.argv[1]) if len(sys.argv) > 1 else SCALE_VMS), indent=2
        )
    )
