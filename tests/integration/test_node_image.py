"""The node daemon's OCI image as a cluster runs it (tests/node_image.py: podman under runc
with the DaemonSet's arguments, security context, memory limit and mounts: root without a
capability, a read-only root, the host's directories read-only where the host has them, /tmp
in memory). A declared VM's agent is a real agent on a fake root whose socket is
root's, mode 0600, as containerd makes a shim's: /metrics shows the VM served, and SIGTERM
ends the daemon cleanly.

Two departures from a pod, both for the test's sake: the container shares the host's network
(podman's own needs CNI plugins a test host may lack), so --listen takes a free loopback port;
and --declared names the VM, whose directory is mounted read-only where it is.

Needs the image (`make node-image`, or `make test`, which builds it), podman, runc and root.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestagent.host.sizing.boot import free_tcp_port
from tests.fakes.agentproc import AgentProcess
from tests.node_image import (
    daemonset_command,
    daemonset_pod,
    loaded_image,
    megabytes,
    podman,
    rss_kib,
    vm_samples,
)

SERVED_WITHIN = 60.0


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    yield from loaded_image()


def test_the_image_serves_a_vm_as_the_daemonset_runs_it(
    image: str, agent: AgentProcess, tmp_path: Path
) -> None:
    pod = daemonset_pod()
    (container,) = pod["containers"]
    assert image.endswith(container["image"])  # localhost/ is podman's own prefix.
    host = tmp_path / "host"  # The node's file system, as far as the DaemonSet mounts it.
    (host / "run/containerd").mkdir(parents=True)  # Its CRI's; no CRI answers there.
    agent.unix_path.chmod(0o600)
    assert agent.unix_path.stat().st_uid == 0
    vms = tmp_path / "vms.toml"
    vms.write_text(f'[[vm]]\nid = "vm-a"\nagent = "{agent.unix_target}"\n')
    port = free_tcp_port()
    name = f"guestagent-node-test-{os.getpid()}"
    log = tmp_path / "node.log"
    mine = f"{tmp_path}:{tmp_path}:ro"
    command = daemonset_command(name, host, port, mine, args=("--declared", str(vms)))
    with open(log, "wb") as output:
        node = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        samples = vm_samples(port, "vm-a")
        while samples.get("guestagent_node_vm_up") != 1.0:
            assert node.poll() is None, log.read_text()
            assert time.monotonic() - started < SERVED_WITHIN, (samples, log.read_text())
            time.sleep(0.2)
            samples = vm_samples(port, "vm-a")
        served = time.monotonic() - started
        assert samples["guestagent_node_vm_info"] == 1.0
        resident = rss_kib(name)
        print(f"vm-a served {served:.1f} s after podman run; the daemon's RSS {resident} KiB")
        request = megabytes(container["resources"]["requests"]["memory"])
        assert resident < request * 1024, f"RSS {resident} KiB over the request {request} Mi"
    finally:
        podman("stop", "--time=30", name, check=False)
        status = node.wait(timeout=60)
    text = log.read_text()
    assert status == 0, text
    assert '"event": "vm_discovered"' in text and '"vm": "vm-a"' in text, text
    assert '"event": "node_stopped"' in text, text
    assert "Traceback" not in text, text
