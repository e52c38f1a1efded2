"""The node daemon's Prometheus families: one endpoint for the node, each VM's series labelled
with its sandbox (and its pod, where CRI names it), built at each scrape from the loops'
views, so a VM that goes away takes its series with it. Pure: views in, families out."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from guestagent.host.metrics.families import Family, Sample
from guestagent.host.node.guest import GuestView, Phase
from guestagent.host.node.pressure import HostMemory

LABELS = ("sandbox_id", "pod", "namespace")
PodNames = Mapping[str, tuple[str, str]]  # sandbox id: (pod name, namespace)


def _value(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _per_vm(
    name: str,
    help_: str,
    views: Sequence[GuestView],
    pods: PodNames,
    value: Callable[[GuestView], float | None],
) -> Family:
    """A gauge with a sample for each VM that has the figure."""
    samples = []
    for view in views:
        figure = value(view)
        if figure is not None:
            pod, namespace = pods.get(view.sandbox.id, ("", ""))
            samples.append(Sample((view.sandbox.id, pod, namespace), float(figure)))
    return Family(name, "gauge", help_, LABELS, tuple(samples))


def vm_families(views: Sequence[GuestView], pods: PodNames) -> list[Family]:
    def labels(view: GuestView) -> tuple[str, ...]:
        return (view.sandbox.id, *pods.get(view.sandbox.id, ("", "")))

    info = Family(
        "guestagent_node_vm_info",
        "gauge",
        "1 for each VM the node serves: where it was found, its VMM, who drives its balloon, "
        "its agent's version and contract revision",
        (*LABELS, "source", "vmm", "balloon", "agent_version", "contract_revision"),
        tuple(
            Sample(
                (
                    *labels(v),
                    v.sandbox.source,
                    v.sandbox.vmm.kind,
                    v.sandbox.balloon.value,
                    v.agent_version,
                    str(v.contract_revision or ""),
                ),
                1.0,
            )
            for v in views
        ),
    )
    changes = Family(
        "guestagent_node_vm_balloon_changes_total",
        "counter",
        "the balloon asked to change, by direction and cause",
        (*LABELS, "direction", "cause"),
        tuple(
            Sample((*labels(v), direction, cause), float(count))
            for v in views
            for direction, cause, count in v.changes
        ),
    )
    return [
        info,
        _per_vm(
            "guestagent_node_vm_up",
            "1 while the VM's agent answers, else 0",
            views,
            pods,
            lambda v: 1.0 if v.reachable else 0.0,
        ),
        _per_vm(
            "guestagent_node_vm_failures",
            "failures in a row reaching the VM (the shim, the agent or the VMM)",
            views,
            pods,
            lambda v: float(v.failures),
        ),
        _per_vm(
            "guestagent_node_vm_balloon_taken_bytes",
            "what the balloon holds of the guest's memory: given back to the host",
            views,
            pods,
            lambda v: v.taken,
        ),
        _per_vm(
            "guestagent_node_vm_balloon_asked_bytes",
            "what the balloon is asked to hold",
            views,
            pods,
            lambda v: v.asked,
        ),
        _per_vm(
            "guestagent_node_vm_safe_bytes",
            "the most the balloon may hold: the agent's safe figure less the headroom",
            views,
            pods,
            lambda v: v.safe,
        ),
        _per_vm(
            "guestagent_node_vm_cold_bytes",
            "the guest's cold memory, by its agent",
            views,
            pods,
            lambda v: v.cold,
        ),
        _per_vm(
            "guestagent_node_vm_memory_total_bytes",
            "the guest's MemTotal",
            views,
            pods,
            lambda v: v.mem_total,
        ),
        _per_vm(
            "guestagent_node_vm_stall_ratio",
            "share of the last interval some task in the guest stalled on memory",
            views,
            pods,
            lambda v: v.stall,
        ),
        _per_vm(
            "guestagent_node_vm_headroom_bytes",
            "what the guest keeps above its safe figure: 0 while the host or its VMM's "
            "cgroup is short",
            views,
            pods,
            lambda v: None if v.headroom is None else v.headroom.bytes,
        ),
        _per_vm(
            "guestagent_node_vm_vmm_cgroup_memory_bytes",
            "memory.current of the host cgroup the VMM runs in",
            views,
            pods,
            lambda v: None if v.vmm_cgroup is None else v.vmm_cgroup.current,
        ),
        _per_vm(
            "guestagent_node_vm_vmm_cgroup_limit_bytes",
            "memory.max of the host cgroup the VMM runs in (+Inf: max)",
            views,
            pods,
            lambda v: (
                None
                if v.vmm_cgroup is None
                else _value(v.vmm_cgroup.limit if v.vmm_cgroup.limit is not None else math.inf)
            ),
        ),
        changes,
    ]


def node_families(
    views: Sequence[GuestView], pods: PodNames, host: HostMemory | None, short: str | None
) -> list[Family]:
    """Every family a scrape serves: the node's totals, then each VM's."""
    by_phase = {phase: 0 for phase in Phase}
    for view in views:
        by_phase[view.phase] += 1
    families = [
        Family(
            "guestagent_node_vms",
            "gauge",
            "the VMs the node serves, by their loop's phase",
            ("phase",),
            tuple(Sample((p.value,), float(n)) for p, n in by_phase.items()),
        ),
        Family(
            "guestagent_node_balloon_taken_bytes",
            "gauge",
            "what every followed balloon holds: memory the guests gave back",
            (),
            (Sample((), float(sum(v.taken or 0 for v in views))),),
        ),
        Family(
            "guestagent_node_host_short",
            "gauge",
            "1 while the host is short of memory (guests are taken down to their safe figure)",
            (),
            (Sample((), 1.0 if short else 0.0),),
        ),
    ]
    if host is not None:
        stall = None if host.psi_some_avg10 is None else host.psi_some_avg10 / 100
        families += [
            Family(
                "guestagent_node_host_memory_available_bytes",
                "gauge",
                "the host's MemAvailable",
                (),
                (Sample((), float(host.mem_available)),),
            ),
            Family(
                "guestagent_node_host_memory_stall_ratio",
                "gauge",
                "the host's /proc/pressure/memory some avg10, as a share",
                (),
                (Sample((), _value(stall)),),
            ),
        ]
    return families + vm_families(views, pods)
