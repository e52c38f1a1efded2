"""Start the real agent daemon as a subprocess over a fake root, as the host would run it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import free_tcp_port


@dataclass
class AgentProcess:
    root: Path
    workdir: Path
    extra_args: tuple[str, ...] = ()
    # A command the agent runs under (prlimit, to give it a service's limits).
    wrapper: tuple[str, ...] = ()
    tcp_port: int = field(default_factory=free_tcp_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def unix_path(self) -> Path:
        return self.workdir / "agent.sock"

    @property
    def unix_target(self) -> str:
        return f"unix://{self.unix_path}"

    @property
    def tcp_target(self) -> str:
        return f"tcp://127.0.0.1:{self.tcp_port}"

    @property
    def stderr_path(self) -> Path:
        return self.workdir / "agent.stderr"

    def start(self) -> float:
        """Start and wait until serving; returns seconds from exec to SERVING."""
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [
                *self.wrapper,
                sys.executable,
                "-m",
                "guestagent",
                "serve",
                "--root",
                str(self.root),
                "--listen",
                self.unix_target,
                "--listen",
                self.tcp_target,
                "--grace-seconds",
                "3",
                *self.extra_args,
            ],
            stderr=open(self.stderr_path, "wb"),  # noqa: SIM115 - owned by the child
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = started + 30
        while not self.unix_path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent did not start: {self.stderr_path.read_text()}")
            time.sleep(0.02)
        with AgentClient(self.unix_target) as client:
            client.wait_ready(timeout=30)
        return time.monotonic() - started

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_events(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.stderr_path.read_text().splitlines() if line]

    def terminate(self, timeout: float = 15) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def guestctl(*args: str) -> subprocess.CompletedProcess[str]:
    """guestctl in a process of its own, as a user runs it."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from guestagent.host.ctl import main; raise SystemExit(main())",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
