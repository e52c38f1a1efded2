"""The agent's own cgroup and locked memory, so reclaim and swapping spare the process that
manages them.

The agent is needed most when the guest is short of memory. Left in the root cgroup, its
pages are reclaimed and swapped like anyone's, and every call then waits for them to come
back. In a cgroup of its own with memory.min covering its footprint, the kernel reclaims
elsewhere first; memory.high bounds what a leak in the agent could take from the workloads.
Under systemd the unit already gives it a cgroup with MemoryMin/MemoryHigh, so it stays there;
started by kata-agent (a guest extension), it shares kata-agent's cgroup, so it moves out.
memory.min covers only part of it, though, so that a host can take its cold pages: through a
whole-guest thrash the rest was reclaimed and faulted back (3071 major faults in a minute,
docs/measurements.md), so the agent also locks what it touches (lock_self).
"""

from __future__ import annotations

import os
from enum import Enum

from guestagent.errors import AgentError, errno_text
from guestagent.jsonlog import EventLog
from guestagent.linux.cgroup import memory
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.linux.cgroup.procs import move_process, read_cgroup_procs, read_own_cgroup
from guestagent.linux.cgroup.tree import create_cgroup, read_mount_facts
from guestagent.linux.kernel import Kernel
from guestagent.linux.syscalls import lock_memory
from guestagent.records import record
from guestagent.sizes import MIB

log = EventLog("guestagent.ops.self_cgroup")

AGENT_CGROUP = cgroup_name("guestagent")
# Covers what the serving agent uses (2026-12-04, tests/vm/test_squeeze.py: memory.current 37.7
# MiB idle, 42.3 at the peak; about 28 MiB of it idle for 30 s or more in the give-back test),
# so its hot pages are reclaimed after the workloads' memory. Not its whole footprint: the
# kernel never reclaims memory under memory.min, so a host's balloon could take none of the
# agent's cold pages (48 MiB here kept 28 MiB of them from every give-back).
MEMORY_MIN = 24 * MIB
# A ceiling, not a kill: above it the kernel throttles and reclaims the agent. 80 MiB is what
# Apple's vminitd sets on its own cgroup, /vminitd, before it serves (apple/containerization,
# vminitd AgentCommand.swift, next to a 50 MiB memory.low; min here, since low yields to
# pressure that min does not). No memory.max, as vminitd sets none.
MEMORY_HIGH = 80 * MIB
# The systemd units (image/guestagent.service, and the Kata extension's, derived from it) set
# the same: tests/unit/test_units.py fails when they disagree.


class Action(Enum):
    MOVE = "move"  # create the cgroup if needed, move in, set memory.min and memory.high
    STAY = "stay"  # already in a cgroup someone gave it (systemd's unit): leave it as it is
    SKIP = "skip"  # cannot or should not: not root, no cgroup2 root, no memory controller


@record
class Decision:
    action: Action
    reason: str
    current: str | None = None  # the cgroup it runs in, as /proc/self/cgroup names it


def decide(
    euid: int,
    current: str | None,
    root_controllers: str | None,
    root_has_type: bool,
    shared: bool = False,
) -> Decision:
    """Whether the agent should move itself into its own cgroup, from what it can read.

    `current` is the cgroup2 path this process runs in (None: none), `root_controllers` is
    the mount's cgroup.controllers (None: not cgroup2), `root_has_type`
    whether the mount has cgroup.type, which the kernel gives every cgroup but the real root:
    in a cgroup namespace the mount shows some other cgroup, whose parent owns the agent.
    `shared`: other processes run in `current` too, so it is not the agent's own.
    """
    if euid != 0:
        return Decision(Action.SKIP, "not running as root")
    if root_controllers is None or root_has_type:
        return Decision(Action.SKIP, "the cgroup mount is not a cgroup2 root")
    if "memory" not in root_controllers.split():
        return Decision(Action.SKIP, "the kernel has no memory controller")
    if current is None:
        return Decision(Action.SKIP, "this process is in no cgroup2 cgroup")
    if current == f"/{AGENT_CGROUP}":
        return Decision(Action.MOVE, "already in its cgroup; setting its protection", current)
    if current != "/" and not shared:
        return Decision(Action.STAY, "already in a cgroup of its own (a service unit)", current)
    if current != "/":
        # kata-agent starts an extension's processes in its own cgroup: there the agent's
        # bounds would be kata-agent's, or none.
        return Decision(Action.MOVE, "sharing its cgroup with other processes", current)
    return Decision(Action.MOVE, "running in the root cgroup", current)


def protect_self(kernel: Kernel, pid: int | None = None, euid: int | None = None) -> Decision:
    """Move this process into /guestagent with its protection, and log what was done.

    Never fatal: an agent without its own cgroup still serves, it just competes for memory.
    """
    pid = os.getpid() if pid is None else pid
    euid = os.geteuid() if euid is None else euid
    current = read_own_cgroup(kernel)
    facts = read_mount_facts(kernel)
    decision = decide(euid, current, *facts)
    # Whether it is alone is asked only of a cgroup it would stay in: one on a real cgroup2
    # root, whose path stays below the mount (in a cgroup namespace it may start with '..').
    if (
        decision.action is Action.STAY
        and current is not None
        and set(read_cgroup_procs(kernel, current)) - {pid}
    ):
        decision = decide(euid, current, *facts, shared=True)
    if decision.action is not Action.MOVE:
        log.info(
            "self_cgroup",
            action=decision.action.value,
            reason=decision.reason,
            cgroup=decision.current,
        )
        return decision
    try:
        create_cgroup(kernel, AGENT_CGROUP)
        move_process(kernel, AGENT_CGROUP, pid)
        cgroup = kernel.cgroup(AGENT_CGROUP)
        cgroup.set_limit(memory.MEMORY_MIN, MEMORY_MIN)
        cgroup.set_limit(memory.MEMORY_HIGH, MEMORY_HIGH)
    except (AgentError, OSError) as e:
        error = errno_text(e) if isinstance(e, OSError) else str(e)
        log.warning("self_cgroup_failed", reason=decision.reason, error=error)
        return Decision(Action.SKIP, f"failed: {error}", decision.current)
    log.info(
        "self_cgroup",
        action=decision.action.value,
        reason=decision.reason,
        cgroup=f"/{AGENT_CGROUP}",
        moved_from=decision.current,
        pid=pid,
        memory_min=MEMORY_MIN,
        memory_high=MEMORY_HIGH,
    )
    return decision


def lock_self(kernel: Kernel) -> bool:
    """Lock the agent's pages in memory as they are touched (lock_memory), so that a guest
    swapping everything else still finds the agent's code and heap in RAM; logged. Serving a
    test tree (not the real kernel) it locks nothing. Never fatal: unlocked, it still serves."""
    if not kernel.is_real:
        return False
    try:
        lock_memory()
    except OSError as e:
        log.warning("memory_lock_failed", error=errno_text(e))
        return False
    log.info("memory_locked", flags="MCL_CURRENT|MCL_FUTURE|MCL_ONFAULT")
    return True
