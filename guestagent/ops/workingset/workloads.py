"""Which cgroups are the guest's workloads, for SetReclaimPolicy's `workloads` (contract
revision 4): a host that serves tens of guests cannot name each one's containers, and the
runtimes put them in different places (Kata's agent where the OCI spec's cgroupsPath says:
kubepods/... with the cgroupfs driver, kubepods.slice/... with the systemd one; vminitd a tree
of its own). So the agent takes every cgroup right below the cgroup2 mount that the memory
controller reaches, but for the guest's own: its init's and systemd's (init.scope,
system.slice, user.slice) and the one this agent runs in. Pure: names in, names out."""

from __future__ import annotations

from collections.abc import Iterable

from guestagent.linux.cgroup.name import CgroupName, cgroup_name

# systemd's own top-level cgroups: PID 1, the services, the logins.
SYSTEM = frozenset({"init.scope", "system.slice", "user.slice"})


def workload_cgroups(top_level: Iterable[str], own: str | None) -> tuple[CgroupName, ...]:
    """The workload cgroups among the mount's top-level ones; `own` is the agent's cgroup as
    /proc/self/cgroup names it ("/system.slice/guestagent.service"), whose top it skips."""
    own_top = (own or "").strip("/").split("/")[0]
    return tuple(
        cgroup_name(name) for name in sorted(top_level) if name not in SYSTEM and name != own_top
    )
