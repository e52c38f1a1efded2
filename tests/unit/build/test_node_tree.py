"""The node daemon's tree and bundle, from their inputs: the runtime builder's node spec
reaches none of the guest's layers from the daemon's command, the node's wheels are pinned as
the project pins them, the example policy is the daemon's defaults, and the unit keeps the
agent's hardening."""

from __future__ import annotations

import re
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from guestagent.build.modules import closure
from guestagent.build.runtime import GUEST, NEVER_IMPORTED, NODE, TREES, TreeSpec, forbidden_in
from guestagent.host.node.config import READERS, NodePolicy, parse_policy
from tests.unit.test_units import directives

REPO = Path(__file__).resolve().parents[3]
IMAGE = REPO / "image"
STDLIB = Path(sysconfig.get_paths()["stdlib"])
SUFFIXES = (".cpython-311-x86_64-linux-gnu.so", ".abi3.so", ".so")


def package_closure(spec: TreeSpec) -> set[str]:
    """The spec's closure over the package's sources and the stdlib (third-party packages are
    not searched: they cannot import the package)."""
    found, _ = closure(
        spec.roots,
        [REPO, STDLIB, STDLIB / "lib-dynload"],
        SUFFIXES,
        frozenset(sys.builtin_module_names),
        NEVER_IMPORTED,
    )
    return set(found)


@pytest.mark.parametrize("name", sorted(TREES))
def test_no_tree_reaches_what_its_spec_forbids(name: str) -> None:
    spec = TREES[name]
    assert forbidden_in(package_closure(spec), spec) == ""


def test_the_node_tree_carries_the_daemon_and_every_backend_it_opens_lazily() -> None:
    modules = package_closure(NODE)
    assert {
        "guestagent.host.commands.node",
        "guestagent.host.node.daemon",
        "guestagent.host.node.cri_pb2_grpc",
        "guestagent.host.vmm.cloud_hypervisor",
        "guestagent.host.vmm.firecracker",
        "guestagent.host.vmm.qemu",
        "guestagent.host.metrics.server",
    } <= modules
    assert not {m for m in modules if m.startswith(("guestagent.agent", "guestagent.ops"))}


def test_forbidden_names_whole_subpackages_only() -> None:
    assert forbidden_in(["guestagent.vm.demo", "guestagent.vmm", "guestagent.host.vm"], NODE) == (
        "guestagent.vm.demo"
    )
    assert forbidden_in(["guestagent.host.ctl"], GUEST) == "guestagent.host.ctl"


def pins(path: Path) -> dict[str, Requirement]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    requirements = [Requirement(line) for line in lines if line and not line.startswith("#")]
    return {canonicalize_name(r.name): r for r in requirements}


def pinned_version(requirement: Requirement) -> str:
    (specifier,) = requirement.specifier
    assert specifier.operator == "==", requirement
    return specifier.version


def test_the_nodes_wheels_are_pinned_as_the_project_pins_them() -> None:
    node, guest = pins(IMAGE / "node/requirements.txt"), pins(IMAGE / "requirements.txt")
    versions = {name: pinned_version(r) for name, r in node.items()}
    shared = node.keys() & guest.keys()
    assert shared == {
        "grpcio",
        "protobuf",
        "googleapis-common-protos",
        "grpcio-health-checking",
    }
    assert {name: versions[name] for name in shared} == {
        name: pinned_version(guest[name]) for name in shared
    }
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    allowed: dict[str, Requirement] = {
        canonicalize_name(Requirement(r).name): Requirement(r) for r in extras["vm"]
    }
    assert node.keys() - shared == {"qemu-qmp"}
    for name in node.keys() - shared:
        assert allowed[name].specifier.contains(versions[name]), (name, versions[name])


def uncommented(text: str) -> str:
    """The example policy with every `# key = value` line made a setting."""
    return re.sub(r"^# (\w+ = .*)$", r"\1", text, flags=re.MULTILINE)


def test_the_example_policy_lists_every_key_at_its_default() -> None:
    text = (IMAGE / "node/node.toml").read_text()
    assert parse_policy(text) == NodePolicy()  # As shipped: all comments.
    every = uncommented(text)
    assert parse_policy(every, "node.toml") == NodePolicy()
    listed = {section: set(table) for section, table in tomllib.loads(every).items()}
    assert listed == {section: set(keys) for section, keys in READERS.items()}


def test_a_changed_default_in_the_example_is_caught() -> None:
    text = uncommented((IMAGE / "node/node.toml").read_text())
    assert parse_policy(text.replace('headroom = "256Mi"', 'headroom = "255Mi"')) != NodePolicy()


GUEST_UNIT = IMAGE / "guestagent.service"
NODE_UNIT = IMAGE / "node/guestagent-node.service"
# What the agent's unit sets that the node daemon's must not: the agent writes kernel files,
# runs swapon(2) and keeps state in /run; the daemon does none of that.
AGENT_ONLY = {
    "ReadWritePaths",
    "RuntimeDirectory",
    "RuntimeDirectoryMode",
    "RuntimeDirectoryPreserve",
    "OOMScoreAdjust",
    "MemoryMin",
    "MemoryHigh",
    "LimitNOFILE",
    "KillMode",
    "EnvironmentFile",
    "Wants",
}


def service(unit: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for section, key, value in directives(unit.read_text()):
        if section == "[Service]":
            found.setdefault(key, []).append(value)
    return found


def test_the_node_unit_keeps_the_agents_hardening_and_drops_every_capability() -> None:
    agent, node = service(GUEST_UNIT), service(NODE_UNIT)
    hardening = {
        key
        for key in agent
        if key.startswith(("Protect", "Private", "Restrict", "NoNew", "Lock", "SystemCall"))
    }
    assert hardening - node.keys() == set()
    assert {key for key in node if key in AGENT_ONLY} == set()
    assert node["ProtectSystem"] == ["strict"]
    assert node["CapabilityBoundingSet"] == [""]
    assert node["SystemCallFilter"] == ["@system-service"]
    assert set(node["RestrictAddressFamilies"][0].split()) == {
        "AF_UNIX",
        "AF_VSOCK",
        "AF_INET",
        "AF_INET6",
    }
    for key in ("ProtectKernelTunables", "ProtectControlGroups", "PrivateDevices", "PrivateTmp"):
        assert node[key] == ["yes"], key
    assert node["ExecStart"] == ["/opt/guestagent-node/bin/guestctl node"]
    assert node["Environment"] == ["LC_ALL=C"]
