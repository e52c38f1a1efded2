"""The node daemon against real agents (each a daemon over a fake root): it finds the
declared VMs, serves each, and drops one that goes within 5 s, its loop ended and its series
gone; a VM whose agent is not there is retried, never a traceback, the others untouched."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from guestagent.host.metrics.families import Family
from guestagent.host.node.config import Discovery, NodePolicy, Timeouts
from guestagent.host.node.daemon import NodeDaemon
from guestagent.host.node.guest import GuestView, Phase
from tests.fakes.agentproc import AgentProcess
from tests.fakes.root import make_fake_root

DROPPED_WITHIN = 5.0


def declared(path: Path, vms: dict[str, str]) -> None:
    text = "".join(f'[[vm]]\nid = "{name}"\nagent = "{agent}"\n' for name, agent in vms.items())
    path.write_text(text)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[dict[str, AgentProcess]]:
    started = {}
    for name in ("vm-a", "vm-b"):
        workdir = tmp_path / name
        workdir.mkdir()
        process = AgentProcess(make_fake_root(workdir / "root").root, workdir)
        process.start()
        started[name] = process
    yield started
    for process in started.values():
        process.kill()


def wait_until(what: str, done: Callable[[], bool], seconds: float = 30) -> float:
    started = time.monotonic()
    while not done():
        assert time.monotonic() - started < seconds, f"not within {seconds} s: {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def test_the_node_serves_declared_vms_and_drops_one_that_goes(
    agents: dict[str, AgentProcess], tmp_path: Path
) -> None:
    vms = tmp_path / "vms.toml"
    targets = {name: agent.unix_target for name, agent in agents.items()}
    targets["vm-none"] = f"unix://{tmp_path}/nobody.sock"  # No agent there.
    declared(vms, targets)
    policy = NodePolicy(
        discovery=Discovery(
            kata=False, firecracker_containerd=False, declared=str(vms), scan_seconds=0.5
        ),
        timeouts=Timeouts(call_seconds=5.0, gone_seconds=10.0),
    )
    daemon = NodeDaemon(policy)
    builders: list[Callable[[], list[Family]]] = []

    def serve(build: Callable[[], list[Family]]) -> Callable[[], None]:
        builders.append(build)
        return lambda: None

    runner = threading.Thread(target=daemon.run, args=(serve,), daemon=True)
    runner.start()

    def views() -> dict[str, GuestView]:
        return {v.sandbox.id: v for v in daemon.views()}

    def serving(name: str) -> bool:
        view = views().get(name)
        return view is not None and view.phase is Phase.SERVING and view.mem_total is not None

    wait_until("both agents served", lambda: serving("vm-a") and serving("vm-b"))
    none = views()["vm-none"]
    wait_until("the absent agent retried", lambda: views()["vm-none"].failures >= 1)
    assert not views()["vm-none"].reachable and "nobody.sock" in views()["vm-none"].problem
    assert none.sandbox.source == "declared"

    families = {f.name: f for f in builders[0]()}
    up = {s.label_values[0]: s.value for s in families["guestagent_node_vm_up"].samples}
    assert up == {"vm-a": 1.0, "vm-b": 1.0, "vm-none": 0.0}
    mem = {s.label_values[0] for s in families["guestagent_node_vm_memory_total_bytes"].samples}
    assert mem == {"vm-a", "vm-b"}

    loop_b = daemon.loops["vm-b"]
    declared(vms, {"vm-a": targets["vm-a"], "vm-none": targets["vm-none"]})
    took = wait_until("vm-b dropped", lambda: "vm-b" not in views(), DROPPED_WITHIN)
    loop_b.join(DROPPED_WITHIN)
    assert not loop_b._thread.is_alive(), "vm-b's loop did not end"
    assert loop_b.view.phase is Phase.STOPPED
    families = {f.name: f for f in builders[0]()}
    left = {s.label_values[0] for s in families["guestagent_node_vm_up"].samples}
    assert left == {"vm-a", "vm-none"}, f"vm-b's series went with it ({took:.1f} s)"
    # The agent that stayed was never disturbed by the other's going.
    assert serving("vm-a")

    daemon.stopping.set()
    runner.join(15)
    assert not runner.is_alive()
    assert daemon.views() == []
