"""The node daemon's DaemonSet (image/node/daemonset.yaml): valid against the Kubernetes API
schemas of the oldest and newest versions kubernetes-validate carries (offline, strict: an
unknown key fails), and granting nothing the daemon does not need. Each planted grant
(privileged, a capability, a writable root, a host namespace...) is caught."""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from guestagent.host.ctl import build_parser

REPO = Path(__file__).resolve().parents[3]
MANIFEST = REPO / "image" / "node" / "daemonset.yaml"
# The oldest and the newest schemas kubernetes-validate 1.37.0 carries, and one between.
VERSIONS = ("1.25.0", "1.30.0", "1.37.0")
# What the daemon reads on the host: Kata's Go runtime and runtime-rs, firecracker-containerd's
# shim base, the CRI's socket directory. Each is mounted where the host has it, read-only.
HOST_PATHS = {
    "/run/vc",
    "/run/kata",
    "/var/lib/firecracker-containerd/shim-base",
    "/run/containerd",
}
Manifest = dict[str, Any]


def manifest() -> Manifest:
    document: Manifest = yaml.safe_load(MANIFEST.read_text())
    return document


def pod(document: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = document["spec"]["template"]["spec"]
    return spec


def path_of(volume: dict[str, Any]) -> str:
    return volume["hostPath"]["path"].rstrip("/") or "/"


def problems(document: Manifest) -> list[str]:
    """What the manifest grants beyond the daemon's needs, or gets wrong; [] when nothing."""
    found = []
    spec = pod(document)
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"{key}: the daemon needs no host namespace")
    if spec.get("automountServiceAccountToken") is not False:
        found.append("a service account token: the daemon calls no Kubernetes API")
    if spec.get("hostUsers") is False:
        found.append("hostUsers false: root in a user namespace is not the sockets' owner")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    host_paths = {path_of(v) for v in volumes.values() if "hostPath" in v}
    if set(host_paths) != HOST_PATHS:
        found.append(f"hostPaths {sorted(host_paths)}, not {sorted(HOST_PATHS)}")
    for container in spec.get("initContainers", []) + spec["containers"]:
        name = container["name"]
        context = container.get("securityContext", {})
        expected = {
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsUser": 0,
        }
        for key, value in expected.items():
            if context.get(key) != value:
                found.append(f"{name}: securityContext.{key} is {context.get(key)!r}")
        capabilities = context.get("capabilities", {})
        if capabilities.get("drop") != ["ALL"] or capabilities.get("add"):
            found.append(f"{name}: capabilities {capabilities}, not all dropped and none added")
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "hostPath" not in volume:
                continue
            if not mount.get("readOnly"):
                found.append(f"{name}: {path_of(volume)} is mounted writable")
            if mount["mountPath"].rstrip("/") != path_of(volume):
                found.append(
                    f"{name}: {path_of(volume)} is mounted at {mount['mountPath']}: "
                    "a shim names sockets by the host's paths"
                )
        if "memory" not in container.get("resources", {}).get("limits", {}):
            found.append(f"{name}: no memory limit")
    return found


def test_the_daemonset_is_valid_for_each_kubernetes_version_strictly() -> None:
    for version in VERSIONS:
        assert kubernetes_validate.validate(manifest(), version, strict=True) == version[:4]


def test_an_unknown_key_fails_the_strict_validation() -> None:
    document = manifest()
    pod(document)["volumes"][0]["hostPath"]["tpye"] = "Directory"
    with pytest.raises(kubernetes_validate.ValidationError, match="tpye"):
        kubernetes_validate.validate(document, VERSIONS[-1], strict=True)


def test_the_daemonset_grants_nothing_the_daemon_does_not_need() -> None:
    assert problems(manifest()) == []


def container(document: Manifest) -> dict[str, Any]:
    first: dict[str, Any] = pod(document)["containers"][0]
    return first


def set_context(key: str, value: Any) -> Callable[[Manifest], None]:
    def plant(document: Manifest) -> None:
        container(document)["securityContext"][key] = value

    return plant


def add_capability(document: Manifest) -> None:
    container(document)["securityContext"]["capabilities"]["add"] = ["DAC_OVERRIDE"]


def mount_writable(document: Manifest) -> None:
    container(document)["volumeMounts"][0]["readOnly"] = False


def host_pid(document: Manifest) -> None:
    pod(document)["hostPID"] = True


def host_root(document: Manifest) -> None:
    pod(document)["volumes"].append({"name": "root", "hostPath": {"path": "/"}})


def mounted_elsewhere(document: Manifest) -> None:
    container(document)["volumeMounts"][0]["mountPath"] = "/host/run/vc"


def privileged_init(document: Manifest) -> None:
    init = copy.deepcopy(container(document))
    init["name"] = "setup"
    init["securityContext"]["privileged"] = True
    pod(document)["initContainers"] = [init]


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(set_context("privileged", True), id="privileged"),
        pytest.param(set_context("allowPrivilegeEscalation", True), id="escalation"),
        pytest.param(set_context("readOnlyRootFilesystem", False), id="writable_root"),
        pytest.param(set_context("runAsUser", 1000), id="not_root"),
        add_capability,
        mount_writable,
        host_pid,
        host_root,
        mounted_elsewhere,
        privileged_init,
    ],
)
def test_each_planted_grant_is_caught_and_stays_schema_valid(
    plant: Callable[[Manifest], None],
) -> None:
    document = manifest()
    plant(document)
    # Valid for Kubernetes, so only the check above stands between it and a cluster.
    kubernetes_validate.validate(document, VERSIONS[-1], strict=True)
    found = problems(document)
    assert len(found) == 1, found


def test_the_command_is_one_guestctl_takes_and_the_scrape_finds_it() -> None:
    spec = container(manifest())
    args = build_parser().parse_args(["node", *spec["args"]])
    port = args.listen.port
    annotations = manifest()["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port
    assert [p["containerPort"] for p in spec["ports"]] == [port]
    assert args.listen.host == "0.0.0.0"  # The pod's address, where Prometheus scrapes it.
    assert args.root is None  # Mounted where the host has them: the shims' paths hold.


def test_the_image_is_the_one_make_node_image_names() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert container(manifest())["image"] == f"guestagent-node:{version}"
