"""A cgroup's name, checked once where it comes in (a request, a state file, the command line)
and carried from there as a CgroupName: a path relative to the cgroup2 mount that cannot
lead out of it.

A container must not be able to make the agent read or write outside the mount, so '..',
'.', empty and absolute names are refused before any file is touched (and every lookup is
made beneath the mount by KernelFS besides: a symlink anywhere in cgroupfs is refused).
"""

from __future__ import annotations

from guestagent.errors import InvalidArgument, quoted

# The kernel's limits (ENAMETOOLONG past them), checked up front to name the culprit.
NAME_MAX = 255
PATH_MAX = 4096


class CgroupName(str):
    """A checked cgroup name in its one form, 'pod/ctr' (no leading, doubled or trailing
    slash), as keys, state files and answers hold it. A str, so it is joined, logged and sent
    as one; made by cgroup_name alone (tests/unit/test_layout.py holds every other module to
    that), so what takes a CgroupName never checks it again."""

    __slots__ = ()

    @property
    def lineage(self) -> tuple[CgroupName, ...]:
        """The cgroup's ancestors below the mount, then itself: 'a', 'a/b', 'a/b/c'."""
        parts = self.split("/")
        return tuple(CgroupName("/".join(parts[:depth])) for depth in range(1, len(parts) + 1))


def cgroup_name(text: str) -> CgroupName:
    """A cgroup named relative to the mount, checked; InvalidArgument (CGROUP_PATH_INVALID)
    naming the value for anything that could escape the mount or that the kernel refuses
    for its length.

    Doubled and trailing slashes name the same cgroup as the path without them, so they are
    dropped here: 'pod/ctr/' is 'pod/ctr'.
    """
    if not text:
        raise InvalidArgument(
            "cgroup path is empty; name a cgroup below the cgroup2 mount", "CGROUP_PATH_INVALID"
        )
    if "\x00" in text:
        raise InvalidArgument(
            f"cgroup path {quoted(text)} contains a NUL byte", "CGROUP_PATH_INVALID"
        )
    if len(text.encode(errors="surrogatepass")) > PATH_MAX:
        raise InvalidArgument(
            f"cgroup path of {len(text.encode(errors='surrogatepass'))} bytes is over {PATH_MAX}",
            "CGROUP_PATH_INVALID",
        )
    if text.startswith("/"):
        raise InvalidArgument(
            f"cgroup path {quoted(text)} is absolute; give it relative to the mount",
            "CGROUP_PATH_INVALID",
        )
    parts = tuple(part for part in text.split("/") if part)  # Not empty: text is relative.
    for part in parts:
        if part in (".", ".."):
            raise InvalidArgument(
                f"cgroup path {quoted(text)} has a {part!r} component", "CGROUP_PATH_INVALID"
            )
        if len(part.encode(errors="surrogatepass")) > NAME_MAX:
            raise InvalidArgument(
                f"cgroup path component {quoted(part)} is "
                f"{len(part.encode(errors='surrogatepass'))} bytes, over {NAME_MAX}",
                "CGROUP_PATH_INVALID",
            )
    return CgroupName("/".join(parts))
