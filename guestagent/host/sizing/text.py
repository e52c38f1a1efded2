"""The plan as guestctl prints it: text for people, a dict for --json."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from guestagent.host.sizing.model import mib_text
from guestagent.host.sizing.plan import Plan


def verdict_text(result: Plan) -> str:
    usage = (
        f"VM {mib_text(result.vm_size)} + VMM overhead {mib_text(result.vmm)} = "
        f"{mib_text(result.host_usage)}"
    )
    if result.pod_limit is None:
        return f"preflight ok: the pod has no memory limit on the host; it will use {usage}"
    if result.ok:
        return f"preflight ok: pod limit {mib_text(result.pod_limit)} covers {usage}"
    return (
        f"preflight FAILED: pod limit {mib_text(result.pod_limit)} is below {usage}: short by "
        f"{mib_text(result.shortfall)}; the host would OOM-kill the VM once the guest faults its "
        f"RAM in. Raise the pod limit (declare a RuntimeClass overhead of "
        f"{mib_text(result.runtime_class_overhead)}) or lower default_memory"
    )


def plan_text(result: Plan) -> str:
    hotplug = result.hotplug
    lines = [
        f"hotplug      {mib_text(hotplug.amount)}"
        + (f" (clamped from {mib_text(hotplug.wanted)})" if hotplug.clamped else ""),
        f"VM size      {mib_text(result.vm_size)} (ceiling {mib_text(hotplug.ceiling)})",
        f"overhead     kernel {mib_text(result.kernel)}  guest daemons {mib_text(result.daemons)}  "
        f"VMM {mib_text(result.vmm)}  ({result.model_source})",
        f"containers   {mib_text(result.container_room)} left for them (VM - kernel - daemons)",
        f"RuntimeClass overhead to declare: {mib_text(result.runtime_class_overhead)}",
    ]
    lines += [f"warning: {w}" for w in result.warnings]
    lines.append(verdict_text(result))
    return "\n".join(lines)


def plan_to_dict(result: Plan) -> dict[str, Any]:
    return {**asdict(result), "ok": result.ok}
