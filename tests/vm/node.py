"""The node daemon in the VM tests: from its OCI image as the DaemonSet runs it, or as the
host's unit runs it, its JSON log lines kept and its /metrics read."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.node_image import daemonset_command, podman


@dataclass
class Node:
    """The daemon, as the DaemonSet starts it; its JSON log lines kept."""

    process: subprocess.Popen[str]
    port: int
    lines: list[dict[str, Any]] = field(default_factory=list)

    container: str | None = None

    @classmethod
    def start(cls, config: Path, port: int) -> Node:
        """The daemon as the host's unit runs it (the systemd unit starts the same command)."""
        command = [sys.executable, "-m", "guestagent.host.ctl", "node", "--config", str(config)]
        return cls._run(command, port)

    @classmethod
    def start_image(cls, host: Path, config: Path, port: int) -> Node:
        """The daemon from its OCI image as the DaemonSet runs it (tests/node_image.py), its
        hostPaths under `host`; the policy file is the test's, mounted read-only."""
        name = f"guestagent-node-vm-test-{os.getpid()}"
        # The CRI's directory, which the DaemonSet mounts; no CRI answers there.
        (host / "run/containerd").mkdir(parents=True, exist_ok=True)
        volume = f"{config}:{config}:ro"
        command = daemonset_command(name, host, port, volume, args=("--config", str(config)))
        node = cls._run(command, port)
        node.container = name
        return node

    @classmethod
    def _run(cls, command: list[str], port: int) -> Node:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        node = cls(process, port)
        threading.Thread(target=node._read, daemon=True).start()
        return node

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            try:
                self.lines.append({**json.loads(line), "t": time.monotonic()})
            except json.JSONDecodeError:
                self.lines.append({"event": "not_json", "line": line})

    def metrics(self) -> dict[str, float]:
        """Each sample of /metrics, by its line's name and labels."""
        url = f"http://127.0.0.1:{self.port}/metrics"
        try:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError:
            return {}
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def up(self) -> set[str]:
        """The sandboxes /metrics shows."""
        return {
            name.split('sandbox_id="')[1].split('"')[0]
            for name in self.metrics()
            if name.startswith("guestagent_node_vm_up{")
        }

    def events(self, event: str) -> list[dict[str, Any]]:
        return [line for line in list(self.lines) if line.get("event") == event]

    def kill(self) -> None:
        """At once, as after a failed wait: the container too, which outlives podman's
        client (its --rm removes it only once it stops)."""
        if self.container is not None:
            podman("rm", "--force", "--time=0", self.container, check=False)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(60)

    def stop(self) -> int:
        """SIGTERM, as the unit's stop and the kubelet's do; the daemon's exit status."""
        if self.container is not None:
            podman("stop", "--time=30", self.container, check=False)
        else:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)
