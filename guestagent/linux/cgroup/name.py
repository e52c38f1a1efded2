"""A cgroup's name: a path relative to the cgroup2 mount that cannot lead out of it.

A container must not be able to make the agent read or write outside the mount, so '..',
empty and absolute names are refused before any file is touched (and every lookup is made
beneath the mount by KernelFS besides: a symlink anywhere in cgroupfs is refused).
"""

from __future__ import annotations

from guestagent.errors import InvalidArgument, quoted

# The kernel's limits (ENAMETOOLONG past them), checked up front to name the culprit.
NAME_MAX = 255
PATH_MAX = 4096


def validate_cgroup_name(name: str) -> tuple[str, ...]:
    """Split a relative cgroup path into components, refusing anything that could escape.

    Doubled and trailing slashes name the same cgroup as the path without them, so they are
    dropped here (canonical_cgroup_name joins what is left): 'pod/ctr/' is 'pod/ctr'.
    """
    if not name:
        raise InvalidArgument(
            "cgroup path is empty; name a cgroup below the cgroup2 mount", "CGROUP_PATH_INVALID"
        )
    if "\x00" in name:
        raise InvalidArgument(
            f"cgroup path {quoted(name)} contains a NUL byte", "CGROUP_PATH_INVALID"
        )
    if len(name.encode(errors="surrogatepass")) > PATH_MAX:
        raise InvalidArgument(
            f"cgroup path of {len(name.encode(errors='surrogatepass'))} bytes is over {PATH_MAX}",
            "CGROUP_PATH_INVALID",
        )
    if name.startswith("/"):
        raise InvalidArgument(
            f"cgroup path {quoted(name)} is absolute; give it relative to the mount",
            "CGROUP_PATH_INVALID",
        )
    parts = tuple(part for part in name.split("/") if part)
    if not parts:
        raise InvalidArgument(f"cgroup path {quoted(name)} names no cgroup", "CGROUP_PATH_INVALID")
    for part in parts:
        if part in (".", ".."):
            raise InvalidArgument(
                f"cgroup path {quoted(name)} has a {part!r} component", "CGROUP_PATH_INVALID"
            )
        if len(part.encode(errors="surrogatepass")) > NAME_MAX:
            raise InvalidArgument(
                f"cgroup path component {quoted(part)} is "
                f"{len(part.encode(errors='surrogatepass'))} bytes, over {NAME_MAX}",
                "CGROUP_PATH_INVALID",
            )
    return parts


def canonical_cgroup_name(name: str) -> str:
    """The one form of a cgroup name used for keys, persistence and answers: 'pod/ctr'."""
    return "/".join(validate_cgroup_name(name))
