"""The node's policy and declared VMs: defaults, every key read with its type, and refusals
that name the file, the key and the value."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from guestagent.host.node.config import (
    READERS,
    SECTIONS,
    ConfigError,
    NodePolicy,
    parse_declared,
    parse_policy,
)
from guestagent.host.node.sandboxes import DECLARED, Balloon, Vmm
from guestagent.sizes import GIB, MIB

DOC = Path(__file__).parents[4] / "docs" / "node.md"


def test_no_file_is_the_defaults() -> None:
    assert parse_policy("") == NodePolicy()


def test_every_key_is_read() -> None:
    policy = parse_policy(
        """
        [discovery]
        root = "/host"
        kata = false
        firecracker_containerd = false
        shim_base = "/srv/fc"
        declared = "/etc/guestagent/vms.toml"
        agent_port = 7000
        scan_seconds = 0.5
        [guest]
        reclaim = false
        reclaim_anon = true
        swap_serial = ""
        follow = false
        firecracker_containerd_balloon = "leave"
        interval_seconds = 1
        hold_seconds = 10
        stall_threshold = 0.2
        step = "64Mi"
        cold_after_ms = 30000
        [host]
        headroom = "1G"
        short_psi_some_avg10 = 20
        short_available = 0.05
        cgroup_margin = 134217728
        [metrics]
        listen = "[::]:9465"
        cri_socket = "unix:///run/containerd/containerd.sock"
        [timeouts]
        call_seconds = 3
        gone_seconds = 60
        """
    )
    assert policy.discovery.layout.kata_go == "/host/run/vc/sbs"
    assert policy.discovery.agent_port == 7000 and policy.guest.step == 64 * MIB
    assert policy.host.headroom == GIB and policy.host.cgroup_margin == 128 * MIB
    assert policy.guest.firecracker_containerd_balloon == "leave"
    assert policy.timeouts == dataclasses.replace(
        policy.timeouts, call_seconds=3.0, gone_seconds=60.0
    )
    # Every key of every section was given, so none is left at its default by mistake.
    for name, section in SECTIONS.items():
        assert {f.name for f in dataclasses.fields(section)} == set(READERS[name])


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[guest]\nreclaim = 1\n", "[guest] reclaim: 1 is not a bool"),
        ("[guest]\nrecliam = true\n", "[guest] has no key 'recliam' (it has: reclaim,"),
        ("[gest]\n", "no section 'gest'"),
        ('[host]\nheadroom = "256MB"\n', "[host] headroom: "),
        ("[host]\nheadroom = -1\n", "[host] headroom: -1 is negative"),
        ("[host]\nshort_available = 1.5\n", "[host] short_available: 1.5 is not within 0..1"),
        ("[host]\nshort_psi_some_avg10 = 101\n", "is not a percentage within 0..100"),
        ("[guest]\ninterval_seconds = 0\n", "seconds must be finite and above 0"),
        ("[guest]\ncold_after_ms = -5\n", "cold_after_ms: -5 is negative"),
        ('[guest]\nfirecracker_containerd_balloon = "none"\n', "is not one of follow, leave"),
        ("[discovery]\nagent_port = 0\n", "0 is not a vsock port"),
        ('[metrics]\nlisten = "nowhere"\n', "[metrics] listen:"),
        ("guest = 3\n", "[guest] is not a table"),
        ("[guest\n", "not TOML"),
    ],
)
def test_a_wrong_key_or_value_is_refused_naming_it(text: str, said: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(said)) as refused:
        parse_policy(text, "/etc/guestagent/node.toml")
    assert str(refused.value).startswith("/etc/guestagent/node.toml: ")


def test_declared_vms() -> None:
    (pool, plain) = parse_declared(
        """
        [[vm]]
        id = "pool-1"
        agent = "hvsock:///run/pool/1/vsock.sock:6464"
        vmm = "firecracker"
        api = "/run/pool/1/api.sock"
        balloon = "leave"
        [[vm]]
        id = "plain"
        agent = "vsock://7:6464"
        """,
        "vms.toml",
    )
    assert pool.source == DECLARED and pool.agent == "hvsock:///run/pool/1/vsock.sock:6464"
    assert pool.vmm == Vmm("firecracker", "/run/pool/1/api.sock") and pool.balloon is Balloon.LEAVE
    assert plain.vmm == Vmm("", None) and plain.balloon is Balloon.NONE and plain.shim is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[[vm]]\nid = "a"\n', "vms.toml: vm 1: agent must be a non-empty string"),
        ('[[vm]]\nid = "a"\nagent = "vsock:3"\n', "vms.toml: vm 1: agent: address 'vsock:3'"),
        ('[[vm]]\nid = "a"\nagent = "vsock://3:1"\nvmm = "xen"\napi = "/s"\n', "vmm 'xen' is not"),
        ('[[vm]]\nid = "a"\nagent = "vsock://3:1"\nvmm = "qemu"\n', "vmm and api go together"),
        ('[[vm]]\nid = "a"\nagent = "vsock://3:1"\nballoon = "follow"\n', "is not one of none"),
        ('[[vm]]\nid = "a"\nagent = "vsock://3:1"\n[[vm]]\nid = "a"\nagent = "vsock://4:1"\n',
         "vm 2: id 'a' is declared twice"),
        ('vms = []\n', "no key 'vms': VMs are [[vm]] tables"),
    ],
)  # fmt: skip
def test_a_declared_vm_that_cannot_be_served_is_refused(text: str, said: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(said)):
        parse_declared(text, "vms.toml")


def test_docs_name_every_key() -> None:
    """docs/node.md documents the policy: every key, under its section."""
    text = DOC.read_text()
    missing = [
        f"[{name}] {key}"
        for name, readers in READERS.items()
        for key in readers
        if not re.search(rf"^\| `{key}` \|", text[text.index(f"`[{name}]`") :], re.MULTILINE)
    ]
    assert missing == []
