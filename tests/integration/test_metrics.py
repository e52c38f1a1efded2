"""`guestctl metrics` against the real daemon on a fake root, scraped as Prometheus would."""

from __future__ import annotations

import contextlib
import math
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from guestagent.host.sizing.boot import free_tcp_port
from guestagent.sizes import MIB
from tests.fakes.agentproc import AgentProcess
from tests.fakes.root import FakeRoot

KIB = 1 << 10
Labels = frozenset[tuple[str, str]]
Scrape = dict[tuple[str, Labels], float]


@dataclass
class Exporter:
    proc: subprocess.Popen[bytes]
    port: int
    stderr_path: Path

    def scrape(self) -> tuple[Scrape, dict[str, str]]:
        """Every sample by (name, labels), and each family's type."""
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        samples: Scrape = {}
        types = {}
        for family in text_string_to_metric_families(text):
            types[family.name] = family.type
            for sample in family.samples:
                samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return samples, types

    def wait_for(self, condition: Callable[[Scrape], bool], timeout: float = 20) -> Scrape:
        """Scrape until the condition holds; the exporter may not be listening yet."""
        deadline = time.monotonic() + timeout
        last: Scrape = {}
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.stderr_path.read_text()
            try:
                last, _ = self.scrape()
            except OSError:
                pass
            else:
                if condition(last):
                    return last
            time.sleep(0.05)
        raise AssertionError(f"condition not met in {timeout} s; last scrape {last}")


def guestctl(*args: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        "from guestagent.host.ctl import main; raise SystemExit(main())",
        *args,
    ]


def value(scrape: Scrape, name: str, **labels: str) -> float | None:
    return scrape.get((name, frozenset(labels.items())))


def is_up(scrape: Scrape) -> bool:
    return value(scrape, "guestagent_up") == 1


@pytest.fixture
def exporter(agent: AgentProcess, tmp_path: Path) -> Iterator[Exporter]:
    port = free_tcp_port()
    stderr_path = tmp_path / "metrics.stderr"
    argv = [
        *("--target", agent.unix_target, "metrics", "--listen", f"127.0.0.1:{port}"),
        *("--cgroup", "pod/ctr", "--interval-ms", "100"),
    ]
    proc = subprocess.Popen(
        guestctl(*argv),
        stderr=open(stderr_path, "wb"),  # noqa: SIM115 - owned by the child
    )
    yield Exporter(proc, port, stderr_path)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_the_scrape_equals_the_fake_tree(exporter: Exporter) -> None:
    scrape = exporter.wait_for(is_up)
    expected = {
        "guestagent_memory_total_bytes": 498764 * KIB,
        "guestagent_memory_free_bytes": 301212 * KIB,
        "guestagent_memory_available_bytes": 398100 * KIB,
        "guestagent_memory_buffers_bytes": 2048 * KIB,
        "guestagent_memory_cached_bytes": 80124 * KIB,
        "guestagent_memory_shmem_bytes": 1024 * KIB,
        "guestagent_swap_total_bytes": 1048572 * KIB,
        "guestagent_swap_free_bytes": 1048572 * KIB,
        "guestagent_watch_reconnects_total": 0,
    }
    assert {name: value(scrape, name) for name in expected} == expected
    psi = "guestagent_memory_pressure_stall_seconds_total"
    assert value(scrape, psi, kind="some") == pytest.approx(0.123456)
    assert value(scrape, psi, kind="full") == pytest.approx(0.065432)
    cgroup = {
        "guestagent_cgroup_memory_current_bytes": 3 * MIB,
        "guestagent_cgroup_memory_max_bytes": math.inf,
        "guestagent_cgroup_memory_high_bytes": math.inf,
        "guestagent_cgroup_memory_low_bytes": 0,
        "guestagent_cgroup_memory_swap_current_bytes": 4096,
        "guestagent_cgroup_memory_swap_max_bytes": math.inf,
        "guestagent_cgroup_memory_anon_bytes": 1048576,
        "guestagent_cgroup_memory_file_bytes": 2097152,
    }
    assert {name: value(scrape, name, cgroup="pod/ctr") for name in cgroup} == cgroup
    events = "guestagent_cgroup_memory_events_total"
    assert {
        event: value(scrape, events, cgroup="pod/ctr", event=event)
        for event in ("low", "high", "max", "oom", "oom_kill")
    } == {"low": 0, "high": 3, "max": 2, "oom": 1, "oom_kill": 1}
    assert value(
        scrape,
        "guestagent_cgroup_memory_pressure_stall_seconds_total",
        cgroup="pod/ctr",
        kind="some",
    ) == pytest.approx(0.123456)
    age = value(scrape, "guestagent_report_age_seconds")
    assert age is not None and 0 <= age < 5

    _, types = exporter.scrape()
    assert types["guestagent_cgroup_memory_events"] == "counter"
    assert types["guestagent_memory_pressure_stall_seconds"] == "counter"
    assert types["guestagent_cgroup_memory_current_bytes"] == "gauge"


def test_the_scrape_follows_the_fake_tree(exporter: Exporter, fake_root: FakeRoot) -> None:
    exporter.wait_for(is_up)
    ctr = "sys/fs/cgroup/pod/ctr"
    fake_root.write(f"{ctr}/memory.current", f"{5 * MIB}\n")
    fake_root.write(f"{ctr}/memory.max", f"{64 * MIB}\n")
    fake_root.write(f"{ctr}/memory.events", "low 0\nhigh 3\nmax 2\noom 2\noom_kill 2\n")
    scrape = exporter.wait_for(
        lambda s: (
            value(s, "guestagent_cgroup_memory_current_bytes", cgroup="pod/ctr") == 5 * MIB
            and value(
                s, "guestagent_cgroup_memory_events_total", cgroup="pod/ctr", event="oom_kill"
            )
            == 2
        )
    )
    assert value(scrape, "guestagent_cgroup_memory_max_bytes", cgroup="pod/ctr") == 64 * MIB
    fake_root.write(
        "proc/meminfo",
        (fake_root.root / "proc/meminfo")
        .read_text()
        .replace("MemFree:          301212 kB", "MemFree:          100000 kB"),
    )
    exporter.wait_for(lambda s: value(s, "guestagent_memory_free_bytes") == 100000 * KIB)


def test_it_reconnects_when_the_agent_restarts(exporter: Exporter, agent: AgentProcess) -> None:
    exporter.wait_for(is_up)
    assert agent.terminate() == 0
    down = exporter.wait_for(lambda s: value(s, "guestagent_up") == 0)
    # While the stream is down no figure is served as if it were current.
    assert value(down, "guestagent_memory_total_bytes") is None
    agent.start()
    back = exporter.wait_for(is_up)
    reconnects = value(back, "guestagent_watch_reconnects_total")
    assert reconnects is not None and reconnects >= 1
    assert value(back, "guestagent_memory_total_bytes") == 498764 * KIB
    assert "is back" in exporter.stderr_path.read_text()


def test_sigterm_stops_it_cleanly(exporter: Exporter) -> None:
    exporter.wait_for(is_up)
    exporter.proc.send_signal(signal.SIGTERM)
    assert exporter.proc.wait(timeout=10) == 0
    assert "Traceback" not in exporter.stderr_path.read_text()


def test_sigterm_while_scrapes_are_answered_stops_it_cleanly(exporter: Exporter) -> None:
    """The signal lands while a scrape is being answered (a KeyboardInterrupt raised there was
    asyncio's 'Unhandled exception in client_connected_cb' traceback, in 2 of ~10 runs of the
    test above): scrapers on four threads until the exporter exits."""
    exporter.wait_for(is_up)
    answered = [0]

    def scrape_until_gone() -> None:
        while exporter.proc.poll() is None:
            with contextlib.suppress(OSError):
                exporter.scrape()
                answered[0] += 1

    scrapers = [threading.Thread(target=scrape_until_gone) for _ in range(4)]
    for scraper in scrapers:
        scraper.start()
    while answered[0] < 20:
        time.sleep(0.01)
    exporter.proc.send_signal(signal.SIGTERM)
    assert exporter.proc.wait(timeout=10) == 0
    for scraper in scrapers:
        scraper.join(10)
    assert "Traceback" not in exporter.stderr_path.read_text()


def test_a_taken_port_exits_1_naming_it(agent: AgentProcess) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            guestctl("--target", agent.unix_target, "metrics", "--listen", f"127.0.0.1:{port}"),
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 1
    assert result.stderr.startswith("guestctl: metrics: ") and "in use" in result.stderr
