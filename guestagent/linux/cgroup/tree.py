"""The cgroup2 tree: an existing cgroup's directory, a cgroup made on request and unmade, and
what the mount is.

A cgroup made on request is made whole (its controller enabled in every ancestor) or not at
all, and what was made can be undone, by the call that failed or, from its journal, by the
agent that starts after one died inside it (ops/limits.py).
"""

from __future__ import annotations

import os
from itertools import pairwise

from guestagent.errors import (
    QUOTE_MAX,
    Aborted,
    AgentError,
    FailedPrecondition,
    NotFound,
    caused_by,
    quoted,
)
from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.fs import KernelFS
from guestagent.records import record

SUBTREE_CONTROL = "cgroup.subtree_control"
# The controller a cgroup made on request is made for: this agent acts on memory alone.
CONTROLLER = "memory"


def cgroup_dir(fs: KernelFS, name: CgroupName) -> str:
    """The directory of an existing cgroup; the lookup itself refuses an escape from the mount."""
    path = os.path.join(fs.cgroup_root, name)
    if not fs.is_dir(path):
        raise NotFound(
            f"cgroup {quoted(name)} does not exist under {fs.cgroup_root}",
            "CGROUP_NOT_FOUND",
            metadata={"cgroup": name[:QUOTE_MAX]},
        )
    return path


@record
class CreatedCgroup:
    """A cgroup made on request, and what was changed to make it, so it can be undone."""

    path: str
    # Directories this call made, top down; empty when the cgroup already existed.
    made: tuple[str, ...] = ()
    # cgroup.subtree_control files that received "+memory", top down.
    enabled: tuple[str, ...] = ()


def subtree_controllers(fs: KernelFS, directory: str) -> tuple[str, ...]:
    return tuple(fs.read(os.path.join(directory, SUBTREE_CONTROL)).split())


def create_cgroup(fs: KernelFS, name: CgroupName) -> CreatedCgroup:
    """Make each missing level of a cgroup, enabling the memory controller in every ancestor.

    The controller is enabled top down, where it is not listed already, since the kernel lets
    a cgroup enable only what its parent enabled for it. An existing cgroup is returned as it
    is: enabling controllers above a cgroup someone else made is not this call's business.
    On failure, what was made is removed and what was enabled is disabled again.
    """
    path = os.path.join(fs.cgroup_root, name)
    if fs.is_dir(path):
        return CreatedCgroup(path)
    levels = [fs.cgroup_root, *(os.path.join(fs.cgroup_root, n) for n in name.lineage)]
    for level in levels[1:]:
        if fs.exists(level) and not fs.is_dir(level):
            raise FailedPrecondition(
                f"cgroup path {quoted(name)}: {level} is a file, not a cgroup",
                "NOT_A_CGROUP",
                metadata={"cgroup": name, "path": level},
            )
    for level in levels[:-1]:
        if fs.is_dir(level) and not fs.exists(os.path.join(level, SUBTREE_CONTROL)):
            raise FailedPrecondition(
                f"cgroup path {quoted(name)}: {level} has no {SUBTREE_CONTROL}; "
                "it is not cgroup v2",
                "NOT_A_CGROUP",
                metadata={"cgroup": name, "path": level},
            )

    made: list[str] = []
    enabled: list[str] = []
    try:
        for parent, child in pairwise(levels):
            control = os.path.join(parent, SUBTREE_CONTROL)
            if CONTROLLER not in subtree_controllers(fs, parent):
                fs.write(control, f"+{CONTROLLER}")
                enabled.append(control)
            if not fs.is_dir(child):
                fs.mkdir(child, 0o755)
                made.append(child)
    except AgentError as e:
        undone = undo_create(fs, CreatedCgroup(path, tuple(made), tuple(enabled)))
        raise Aborted(
            f"creating cgroup {quoted(name)} failed: {e}; {undone}",
            "CGROUP_CREATE_FAILED",
            metadata={**caused_by(e), "cgroup": name},
        ) from e
    return CreatedCgroup(path, tuple(made), tuple(enabled))


def undo_create(fs: KernelFS, created: CreatedCgroup) -> str:
    """Remove what create_cgroup made, deepest first; say what was done and what failed."""
    done: list[str] = []
    for directory in reversed(created.made):
        try:
            fs.rmdir(directory)
            done.append(f"removed {directory}")
        except AgentError as e:
            done.append(f"could not {e}")
    for control in reversed(created.enabled):
        if os.path.dirname(control) in created.made:
            continue  # Went with its directory.
        try:
            fs.write(control, f"-{CONTROLLER}")
            done.append(f"wrote '-{CONTROLLER}' to {control}")
        except AgentError as e:
            done.append(f"could not {e}")
    return "; ".join(done) or "nothing had been created"


def creation_plan(fs: KernelFS, name: CgroupName) -> tuple[tuple[CgroupName, ...], tuple[str, ...]]:
    """What create_cgroup will do for `name`, read before it does it: the cgroups it makes,
    top down, and the cgroups whose subtree_control it gives "+memory" ("" is the mount)."""
    made = tuple(n for n in name.lineage if not fs.is_dir(os.path.join(fs.cgroup_root, n)))
    if not made:
        return (), ()
    parents = ("", *name.lineage[:-1])
    enabled = tuple(n for n in parents if n in made or not _has_controller(fs, n))
    return made, enabled


def planned_creation(
    fs: KernelFS, name: CgroupName, made: tuple[CgroupName, ...], enabled: tuple[str, ...]
) -> CreatedCgroup:
    """Of what a creation_plan said would be made and enabled, what is there now, as
    create_cgroup would have reported it: so undo_create can take it back."""
    root = fs.cgroup_root
    directories = tuple(os.path.join(root, n) for n in made if fs.is_dir(os.path.join(root, n)))
    controls = tuple(
        os.path.join(root, n, SUBTREE_CONTROL) for n in enabled if _has_controller(fs, n)
    )
    return CreatedCgroup(os.path.join(root, name), directories, controls)


def _has_controller(fs: KernelFS, name: str) -> bool:
    try:
        return CONTROLLER in subtree_controllers(fs, os.path.join(fs.cgroup_root, name))
    except AgentError:
        return False  # Not a cgroup (create_cgroup refuses it), or gone with one that was made.


def read_mount_facts(fs: KernelFS) -> tuple[str | None, bool]:
    """The mount's cgroup.controllers (None: not cgroup2), and whether it has cgroup.type,
    which the kernel gives every cgroup but the real root."""
    mount = fs.cgroup_root
    controllers = fs.read_optional(os.path.join(mount, "cgroup.controllers"))
    return controllers, fs.exists(os.path.join(mount, "cgroup.type"))


def top_level_cgroups(fs: KernelFS) -> tuple[str, ...]:
    """The cgroups right below the mount that the memory controller reaches (their
    memory.current exists), by name."""
    return tuple(
        name
        for name in fs.subdirectories(fs.cgroup_root)
        if fs.exists(os.path.join(fs.cgroup_root, name, "memory.current"))
    )
