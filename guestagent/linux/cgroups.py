"""Naming and creating cgroups safely: callers give paths relative to the cgroup2 mount.

A container must not be able to make the agent read or write outside the mount, so '..',
absolute paths and symlinks that lead out are refused before any file is touched. A cgroup
made on request is made whole (its controller enabled in every ancestor) or not at all.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from guestagent.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound, errno_text
from guestagent.linux.fs import KernelFS, read_text

SUBTREE_CONTROL = "cgroup.subtree_control"
# The kernel's limits (ENAMETOOLONG past them), checked up front to name the culprit.
NAME_MAX = 255
PATH_MAX = 4096


def validate_cgroup_name(name: str) -> tuple[str, ...]:
    """Split a relative cgroup path into components, refusing anything that could escape."""
    if not name:
        raise InvalidArgument("cgroup path is empty; name a cgroup below the cgroup2 mount")
    if name.startswith("/"):
        raise InvalidArgument(f"cgroup path {name!r} is absolute; give it relative to the mount")
    if "\x00" in name:
        raise InvalidArgument(f"cgroup path {name!r} contains a NUL byte")
    if len(name.encode()) > PATH_MAX:
        raise InvalidArgument(f"cgroup path of {len(name.encode())} bytes is over {PATH_MAX}")
    parts = tuple(name.rstrip("/").split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise InvalidArgument(f"cgroup path {name!r} has a {part or 'empty'!r} component")
        if len(part.encode()) > NAME_MAX:
            raise InvalidArgument(
                f"cgroup path component {part[:32]!r}... is {len(part.encode())} bytes, "
                f"over {NAME_MAX}"
            )
    return parts


def cgroup_dir(fs: KernelFS, name: str) -> Path:
    """The directory of an existing cgroup, after checking it stays inside the mount."""
    path = fs.cgroup_root.joinpath(*validate_cgroup_name(name))
    ensure_inside_mount(fs, name, path)
    if not path.is_dir():
        raise NotFound(f"cgroup {name!r} does not exist under {fs.cgroup_root}")
    return path


def ensure_inside_mount(fs: KernelFS, name: str, path: Path) -> None:
    mount = fs.resolved_cgroup_root
    resolved = path.resolve()
    if resolved != mount and mount not in resolved.parents:
        raise InvalidArgument(f"cgroup path {name!r} resolves to {resolved}, outside {mount}")


@dataclass(frozen=True)
class CreatedCgroup:
    """A cgroup made on request, and what was changed to make it, so it can be undone."""

    path: Path
    # Directories this call made, top down; empty when the cgroup already existed.
    made: tuple[Path, ...] = ()
    # cgroup.subtree_control files that received "+controller", top down.
    enabled: tuple[Path, ...] = ()
    controller: str = "memory"


def write_cgroup_file(path: Path, value: str) -> None:
    """Write one value with one write(2), since the kernel parses each write as a whole value.

    O_TRUNC is what a shell's '>' passes: kernfs ignores the size change, and it empties the
    regular files of a test tree. There is no O_CREAT: a missing file is a missing kernel
    feature, never something to create.
    """
    data = value.encode("ascii")
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        written = os.write(fd, data)
    finally:
        os.close(fd)
    if written != len(data):
        raise OSError(errno.EIO, f"short write, {written} of {len(data)} bytes", str(path))


def subtree_controllers(directory: Path) -> tuple[str, ...]:
    return tuple(read_text(directory / SUBTREE_CONTROL).split())


def create_cgroup(fs: KernelFS, name: str, controller: str = "memory") -> CreatedCgroup:
    """Make each missing level of a cgroup, enabling the controller in every ancestor.

    The controller is enabled top down, where it is not listed already, since the kernel lets
    a cgroup enable only what its parent enabled for it. An existing cgroup is returned as it
    is: enabling controllers above a cgroup someone else made is not this call's business.
    On failure, what was made is removed and what was enabled is disabled again.
    """
    path = fs.cgroup_root.joinpath(*validate_cgroup_name(name))
    ensure_inside_mount(fs, name, path)
    if path.is_dir():
        return CreatedCgroup(path, controller=controller)
    mount = fs.cgroup_root.resolve()
    # Walk the resolved path, so a symlink inside the mount is followed to the real parents.
    parts = path.resolve().relative_to(mount).parts
    levels = [mount.joinpath(*parts[:depth]) for depth in range(len(parts) + 1)]
    for level in levels[1:]:
        if level.exists() and not level.is_dir():
            raise FailedPrecondition(f"cgroup path {name!r}: {level} is a file, not a cgroup")
    for level in levels[:-1]:
        if level.is_dir() and not (level / SUBTREE_CONTROL).is_file():
            raise FailedPrecondition(
                f"cgroup path {name!r}: {level} has no {SUBTREE_CONTROL}; it is not cgroup v2"
            )

    made: list[Path] = []
    enabled: list[Path] = []
    step = ""
    try:
        for parent, child in pairwise(levels):
            control = parent / SUBTREE_CONTROL
            step = f"reading {control}"
            if controller not in subtree_controllers(parent):
                step = f"writing '+{controller}' to {control}"
                write_cgroup_file(control, f"+{controller}")
                enabled.append(control)
            if not child.is_dir():
                step = f"making {child}"
                child.mkdir(mode=0o755)
                made.append(child)
    except OSError as e:
        undone = undo_create(CreatedCgroup(path, tuple(made), tuple(enabled), controller))
        raise Aborted(f"creating cgroup {name!r} failed {step}: {errno_text(e)}; {undone}") from e
    return CreatedCgroup(path, tuple(made), tuple(enabled), controller)


def undo_create(created: CreatedCgroup) -> str:
    """Remove what create_cgroup made, deepest first; say what was done and what failed."""
    done: list[str] = []
    for directory in reversed(created.made):
        try:
            directory.rmdir()
            done.append(f"removed {directory}")
        except OSError as e:
            done.append(f"could not remove {directory}: {errno_text(e)}")
    for control in reversed(created.enabled):
        if control.parent in created.made:
            continue  # Went with its directory.
        try:
            write_cgroup_file(control, f"-{created.controller}")
            done.append(f"wrote '-{created.controller}' to {control}")
        except OSError as e:
            done.append(f"could not write '-{created.controller}' to {control}: {errno_text(e)}")
    return "; ".join(done) or "nothing had been created"
