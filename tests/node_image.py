"""The node daemon's OCI image as a cluster runs it, for the tests that run it (tests/
integration/test_node_image.py, tests/vm/test_node.py): podman under runc (containerd's
runtime) with the DaemonSet's arguments, security context, memory limit and mounts
(image/node/daemonset.yaml), each hostPath taken from a temporary host tree.

Needs the image (`make node-image`, or `make test`, which builds it), podman, runc and root.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.artifacts import built

REPO = Path(__file__).resolve().parents[1]
ARCHIVE = REPO / "image" / "build" / "guestagent-node.oci"
MANIFEST = REPO / "image" / "node" / "daemonset.yaml"
# podman's default limits (a million descriptors) exceed what some hosts let a container
# have; a node's containerd gives its own. These are the agent's unit's and a few threads'.
LIMITS = ("--ulimit", "nofile=8192:8192", "--ulimit", "nproc=4096:4096")
SERVED_WITHIN = 60.0


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "--runtime", "runc", *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=120,
    )


def loaded_image() -> Iterator[str]:
    """The archive loaded into podman's storage; its name, as the DaemonSet names it."""
    archive = built(ARCHIVE, "make node-image")
    missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        reason = f"needs root, podman and runc (missing: {missing or 'root'})"
        if os.environ.get("GUESTAGENT_VM_TESTS") == "required":
            pytest.fail(reason)
        pytest.skip(reason)
    loaded = podman("load", "--input", str(archive))
    match = re.search(r"Loaded image(?:\(s\))?: (\S+)", loaded.stdout + loaded.stderr)
    assert match, loaded.stdout + loaded.stderr
    yield match.group(1)
    podman("rmi", match.group(1), check=False)  # Not forced: another run may be using it.


def megabytes(quantity: str) -> int:
    """A Kubernetes memory quantity in Mi, as podman's --memory takes it."""
    number = re.fullmatch(r"(\d+)Mi", quantity)
    assert number, f"{quantity}: write the manifest's memory in Mi"
    return int(number.group(1))


def run_options(pod: dict[str, Any], host: Path) -> list[str]:
    """podman run's options for the pod's one container: its security context, its memory
    limit and its volumes, each hostPath from under `host` (made, for DirectoryOrCreate)."""
    (container,) = pod["containers"]
    context = container["securityContext"]
    options = ["--user", f"{context['runAsUser']}:{context['runAsGroup']}"]
    if context["readOnlyRootFilesystem"]:
        # podman mounts a tmpfs on /run and /tmp of a read-only container; a pod has none.
        options += ["--read-only", "--read-only-tmpfs=false"]
    options += [f"--cap-drop={c}" for c in context["capabilities"].get("drop", [])]
    options += [f"--cap-add={c}" for c in context["capabilities"].get("add", [])]
    if context["privileged"]:
        options.append("--privileged")
    if not context["allowPrivilegeEscalation"]:
        options += ["--security-opt", "no-new-privileges"]
    if context.get("seccompProfile", {}).get("type") == "Unconfined":
        options += ["--security-opt", "seccomp=unconfined"]
    options.append(f"--memory={megabytes(container['resources']['limits']['memory'])}m")
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            options.append(f"--tmpfs={mount['mountPath']}:rw,size=1m")
            continue
        source = host / volume["hostPath"]["path"].lstrip("/")
        if volume["hostPath"].get("type") == "DirectoryOrCreate":
            source.mkdir(parents=True, exist_ok=True)
        assert source.is_dir(), f"{source}: a hostPath of type Directory must exist"
        mode = "ro" if mount.get("readOnly") else "rw"
        options.append(f"--volume={source}:{mount['mountPath']}:{mode}")
    return options


def listening_at(args: list[str], address: str) -> list[str]:
    """The arguments with --listen's value replaced."""
    at = args.index("--listen")
    return [*args[: at + 1], address, *args[at + 2 :]]


def vm_samples(port: int, sandbox_id: str) -> dict[str, float]:
    """This VM's samples by metric name, from one scrape; {} when nothing answers yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("sandbox_id") == sandbox_id
    }


def rss_kib(name: str) -> int:
    pid = podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert match, status
    return int(match.group(1))


def daemonset_pod() -> dict[str, Any]:
    """The DaemonSet's pod spec."""
    manifest = yaml.safe_load(MANIFEST.read_text())
    pod: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return pod


def daemonset_command(
    name: str, host: Path, port: int, *extra_volumes: str, args: tuple[str, ...] = ()
) -> list[str]:
    """podman run as the DaemonSet runs the daemon, its hostPaths under `host`, /metrics on
    a loopback port of the host's network, and `args` after the DaemonSet's own."""
    pod = daemonset_pod()
    (container,) = pod["containers"]
    return [
        "podman",
        "--runtime",
        "runc",
        "run",
        "--rm",
        f"--name={name}",
        "--network=host",
        *LIMITS,
        *run_options(pod, host),
        *(f"--volume={volume}" for volume in extra_volumes),
        container["image"],
        *listening_at(container["args"], f"127.0.0.1:{port}"),
        *args,
    ]
