"""What a sandbox is, by the runtimes' layouts: the agent URL a shim gives, the VMM its
sockets name, and who drives its balloon."""

from __future__ import annotations

import pytest

from guestagent.host.node.sandboxes import (
    DRAGONBALL,
    FIRECRACKER_CONTAINERD,
    KATA_GO,
    KATA_RS,
    AgentUrlError,
    Balloon,
    Layout,
    Vmm,
    agent_address,
    firecracker_containerd_sandbox,
    hybrid_vsock_vmm,
    kata_balloon,
    kata_sandbox,
    kata_vmm,
)


@pytest.mark.parametrize(
    ("url", "address"),
    [
        # The Go runtime's QEMU, and the same with kata-monitor's trailing newline.
        ("vsock://1234:1024", "vsock://1234:6464"),
        ("vsock://1234:1024\n", "vsock://1234:6464"),
        # Cloud Hypervisor (Go runtime, runtime-rs), Firecracker, Dragonball: the socket kept.
        ("hvsock:///run/vc/vm/abc/clh.sock:1024", "hvsock:///run/vc/vm/abc/clh.sock:6464"),
        ("hvsock:///run/kata/abc/ch-vm.sock:1024", "hvsock:///run/kata/abc/ch-vm.sock:6464"),
        (
            "hvsock:///run/vc/firecracker/abc/root/kata.hvsock:1024",
            "hvsock:///run/vc/firecracker/abc/root/kata.hvsock:6464",
        ),
    ],
)
def test_the_agent_is_the_init_agents_vsock_on_its_own_port(url: str, address: str) -> None:
    assert agent_address(url) == address


def test_a_hybrid_vsocks_host_path_is_found_under_the_root() -> None:
    """A container with the host's /run under /host reaches the shim's host path there."""
    url = "hvsock:///run/vc/vm/abc/clh.sock:1024"
    assert agent_address(url, 6464, "/host") == "hvsock:///host/run/vc/vm/abc/clh.sock:6464"
    assert agent_address("vsock://3:1024", 6464, "/host") == "vsock://3:6464"


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("", "the shim gave no agent URL"),  # runtime-rs on error: 200, empty.
        ("   \n", "the shim gave no agent URL"),
        ("remote:///run/kata/abc/remote.sock", "is not vsock:// or hvsock://"),
        ("mock:///tmp/x", "is not vsock:// or hvsock://"),
        ("vsock://abc:1024", "is not vsock:// or hvsock://"),
        ("hvsock://relative/path:1024", "is not vsock:// or hvsock://"),
        ("unix:///run/x.sock", "is not vsock:// or hvsock://"),
        ("\x00\xff garbage", "is not vsock:// or hvsock://"),
    ],
)
def test_an_agent_url_this_daemon_cannot_use_is_refused_quoting_it(url: str, said: str) -> None:
    with pytest.raises(AgentUrlError, match=said):
        agent_address(url)


@pytest.mark.parametrize(
    ("url", "vmm"),
    [
        ("hvsock:///run/kata/abc/root/kata.hvsock:1024", DRAGONBALL),
        ("hvsock:///run/kata/firecracker/abc/root/kata.hvsock:1024", "firecracker"),
        ("hvsock:///run/kata/abc/kata.hvsock:1024", "firecracker"),
        ("hvsock:///run/vc/firecracker/abc/root/kata.hvsock:1024", "firecracker"),
        ("hvsock:///run/kata/abc/ch-vm.sock:1024", ""),
        ("vsock://3:1024", ""),
    ],
)
def test_a_hybrid_vsock_path_names_its_vmm(url: str, vmm: str) -> None:
    assert hybrid_vsock_vmm(url) == vmm


LAYOUT = Layout("/r")


@pytest.mark.parametrize(
    ("source", "present", "vmm"),
    [
        (
            KATA_GO,
            "/r/run/vc/vm/abc/clh-api.sock",
            Vmm("cloud-hypervisor", "/r/run/vc/vm/abc/clh-api.sock"),
        ),
        # QEMU's monitor is the shim's for the sandbox's life: named, never used.
        (KATA_GO, "/r/run/vc/vm/abc/qmp.sock", Vmm("qemu", None)),
        (KATA_GO, "/r/run/vc/firecracker/abc", Vmm("firecracker", None)),
        (
            KATA_RS,
            "/r/run/kata/abc/ch-api.sock",
            Vmm("cloud-hypervisor", "/r/run/kata/abc/ch-api.sock"),
        ),
        (KATA_RS, "/r/run/kata/firecracker/abc", Vmm("firecracker", None)),
        (KATA_RS, "/r/elsewhere", Vmm("", None)),
    ],
)
def test_a_kata_sandboxs_vmm_is_named_by_its_sockets(source: str, present: str, vmm: Vmm) -> None:
    assert kata_vmm(LAYOUT, source, "abc", {present}) == vmm


def test_only_cloud_hypervisors_balloon_is_followed_under_kata() -> None:
    assert kata_balloon(Vmm("cloud-hypervisor", "/api.sock")) is Balloon.FOLLOW
    assert kata_balloon(Vmm("qemu", None)) is Balloon.NONE
    assert kata_balloon(Vmm("firecracker", None)) is Balloon.NONE
    assert kata_balloon(Vmm(DRAGONBALL, None)) is Balloon.RUNTIME


def test_a_kata_sandbox_is_asked_of_its_shim() -> None:
    sandbox = kata_sandbox(LAYOUT, KATA_RS, "abc", {"/r/run/kata/abc/ch-api.sock"})
    assert (sandbox.agent, sandbox.shim) == (None, "/r/run/kata/abc/shim-monitor.sock")
    assert sandbox.balloon is Balloon.FOLLOW


@pytest.mark.parametrize("name", ["default#vm1", "k8s.io#3f2a-b"])
def test_a_firecracker_containerd_vm_by_its_directory(name: str) -> None:
    sandbox = firecracker_containerd_sandbox(Layout("/r", "/var/lib/fc/shim-base"), name, True)
    assert sandbox is not None and sandbox.source == FIRECRACKER_CONTAINERD
    directory = f"/r/var/lib/fc/shim-base/{name}"
    assert sandbox.agent == f"hvsock://{directory}/firecracker.vsock:6464"
    assert sandbox.vmm == Vmm("firecracker", f"{directory}/firecracker.sock")
    left = firecracker_containerd_sandbox(Layout("/r", "/var/lib/fc/shim-base"), name, False)
    assert left is not None and left.balloon is Balloon.LEAVE


@pytest.mark.parametrize("name", ["nohash", "#vm", "ns#", "lost+found"])
def test_other_names_in_the_shim_base_are_no_vm(name: str) -> None:
    assert firecracker_containerd_sandbox(Layout(), name, True) is None
