"""The node's families from its loops' views: each VM's series labelled with its sandbox and
pod, absent figures absent (not zero), the node's totals, and a VM gone with its series."""

from __future__ import annotations

import math

from guestagent.host.metrics.families import Family
from guestagent.host.node.guest import GuestView, Phase
from guestagent.host.node.metrics import node_families
from guestagent.host.node.pressure import Headroom, HostMemory
from guestagent.host.node.sandboxes import DECLARED, KATA_GO, Balloon, Sandbox, Vmm
from guestagent.linux.cgroup.process_memory import CgroupMemoryUse
from guestagent.sizes import GIB, MIB


def view(name: str, **fields: object) -> GuestView:
    sandbox = Sandbox(
        name,
        KATA_GO,
        None,
        f"/run/vc/sbs/{name}/shim-monitor.sock",
        Vmm("cloud-hypervisor", "/api"),
        Balloon.FOLLOW,
    )
    return GuestView(sandbox, **fields)  # type: ignore[arg-type]


def samples(families: list[Family], name: str) -> dict[tuple[str, ...], float]:
    (family,) = [f for f in families if f.name == name]
    return {s.label_values: s.value for s in family.samples}


VIEWS = [
    view(
        "sb1",
        phase=Phase.SERVING,
        reachable=True,
        agent_version="0.1.0",
        contract_revision=4,
        taken=300 * MIB,
        asked=300 * MIB,
        safe=320 * MIB,
        stall=0.02,
        cold=250 * MIB,
        mem_total=GIB,
        headroom=Headroom(0, "host short"),
        vmm_cgroup=CgroupMemoryUse("/pod", 900 * MIB, None),
        changes=(("inflate", "held", 2), ("deflate", "stall", 1)),
    ),
    view("sb2", phase=Phase.WAITING, failures=3, problem="UNAVAILABLE"),
]
HOST = HostMemory(16 * GIB, 4 * GIB, 12.5)


def test_each_vm_is_labelled_with_its_sandbox_and_pod() -> None:
    families = node_families(VIEWS, {"sb1": ("web-0", "shop")}, HOST, "host memory stall")
    assert samples(families, "guestagent_node_vm_up") == {
        ("sb1", "web-0", "shop"): 1.0,
        ("sb2", "", ""): 0.0,
    }
    # Figures a VM does not have are absent, not zero.
    assert samples(families, "guestagent_node_vm_balloon_taken_bytes") == {
        ("sb1", "web-0", "shop"): 300 * MIB
    }
    assert samples(families, "guestagent_node_vm_headroom_bytes") == {("sb1", "web-0", "shop"): 0}
    limit = samples(families, "guestagent_node_vm_vmm_cgroup_limit_bytes")
    assert math.isinf(limit[("sb1", "web-0", "shop")])
    assert samples(families, "guestagent_node_vm_balloon_changes_total") == {
        ("sb1", "web-0", "shop", "inflate", "held"): 2,
        ("sb1", "web-0", "shop", "deflate", "stall"): 1,
    }
    info = samples(families, "guestagent_node_vm_info")
    assert ("sb1", "web-0", "shop", "kata", "cloud-hypervisor", "follow", "0.1.0", "4") in info


def test_the_nodes_totals() -> None:
    families = node_families(VIEWS, {}, HOST, "host memory stall 12.5%")
    assert samples(families, "guestagent_node_vms")[("serving",)] == 1
    assert samples(families, "guestagent_node_vms")[("waiting",)] == 1
    assert samples(families, "guestagent_node_balloon_taken_bytes") == {(): 300 * MIB}
    assert samples(families, "guestagent_node_host_short") == {(): 1.0}
    assert samples(families, "guestagent_node_host_memory_stall_ratio") == {(): 0.125}


def test_a_vm_gone_takes_its_series() -> None:
    families = node_families(VIEWS[1:], {}, None, None)
    for family in families:
        assert all(s.label_values[:1] != ("sb1",) for s in family.samples), family.name
    assert "guestagent_node_host_memory_available_bytes" not in {f.name for f in families}
    assert DECLARED  # Declared VMs are labelled alike (their source in _info).
