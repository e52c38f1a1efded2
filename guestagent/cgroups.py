"""Naming cgroups safely: callers give paths relative to the cgroup2 mount.

A container must not be able to make the agent read or write outside the mount, so '..',
absolute paths and symlinks that lead out are refused before any file is touched.
"""

from __future__ import annotations

from pathlib import Path

from guestagent.errors import InvalidArgument, NotFound
from guestagent.kernelfs import KernelFS


def validate_cgroup_name(name: str) -> tuple[str, ...]:
    """Split a relative cgroup path into components, refusing anything that could escape."""
    if not name:
        raise InvalidArgument("cgroup path is empty; name a cgroup below the cgroup2 mount")
    if name.startswith("/"):
        raise InvalidArgument(f"cgroup path {name!r} is absolute; give it relative to the mount")
    if "\x00" in name:
        raise InvalidArgument(f"cgroup path {name!r} contains a NUL byte")
    parts = tuple(name.rstrip("/").split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise InvalidArgument(f"cgroup path {name!r} has a {part or 'empty'!r} component")
    return parts


def cgroup_dir(fs: KernelFS, name: str) -> Path:
    """The directory of an existing cgroup, after checking it stays inside the mount."""
    path = fs.cgroup_root.joinpath(*validate_cgroup_name(name))
    ensure_inside_mount(fs, name, path)
    if not path.is_dir():
        raise NotFound(f"cgroup {name!r} does not exist under {fs.cgroup_root}")
    return path


def ensure_inside_mount(fs: KernelFS, name: str, path: Path) -> None:
    mount = fs.cgroup_root.resolve()
    resolved = path.resolve()
    if resolved != mount and mount not in resolved.parents:
        raise InvalidArgument(f"cgroup path {name!r} resolves to {resolved}, outside {mount}")
