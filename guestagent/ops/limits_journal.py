"""The SetMemoryLimits journal: a change in flight, written down in /run until it is done.

A write to memory.max reclaims down to the new limit before it returns, which can take
seconds, and the agent can die inside it (SIGKILL, the OOM killer, a guest kernel killing it)
with memory.swap.max already new and memory.low still old. So before the first change the
agent writes the cgroup and the old and new text of each file here, and removes the journal
once the files read back as the new values. An agent that starts and finds a journal rolls
the cgroup back to the old values rather than completing the change: the caller never got an
answer, so it will retry, and the old set is the one it last saw succeed. This module saves
and loads the journal; the rollback is ops/limits.py's, the same one a failed call runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from guestagent.errors import InvalidArgument, quoted
from guestagent.linux.cgroup.memory import LIMIT_FILES
from guestagent.linux.cgroup.name import CgroupName, cgroup_name
from guestagent.linux.kernel import Kernel
from guestagent.linux.statestore import LIMITS_JOURNAL, StateFile, StateFileError, state_file
from guestagent.records import record

FORMAT_VERSION = 1


class JournalFormatError(StateFileError):
    """A journal this agent cannot read: written by a newer agent, or damaged."""


@record
class FileChange:
    file: str  # memory.max, memory.swap.max or memory.low
    old: str  # the text read before the call, as the kernel showed it
    new: str  # the text the call writes


@record
class Journal:
    cgroup: CgroupName
    changes: tuple[FileChange, ...]  # in the order they are written
    # Cgroups the call makes, top down, and those whose cgroup.subtree_control gets
    # "+memory" ("" is the mount itself): what rolling back has to remove and disable.
    made: tuple[CgroupName, ...] = ()
    enabled: tuple[str, ...] = ()


def encode(journal: Journal) -> dict[str, Any]:
    return {
        "version": FORMAT_VERSION,
        "cgroup": journal.cgroup,
        "changes": [{"file": c.file, "old": c.old, "new": c.new} for c in journal.changes],
        "made": list(journal.made),
        "enabled": list(journal.enabled),
    }


def decode(body: object) -> Journal:
    """The journal in a loaded JSON value; JournalFormatError says what is wrong with it."""
    if not isinstance(body, dict) or body.get("version") != FORMAT_VERSION:
        version = body.get("version") if isinstance(body, dict) else None
        raise JournalFormatError(f"version {version!r}, this agent reads {FORMAT_VERSION}")
    try:
        changes = tuple(
            FileChange(_text(c, "file"), _text(c, "old"), _text(c, "new"))
            for c in _list(body, "changes")
        )
        cgroup = _text(body, "cgroup")
        made = tuple(_str(v) for v in _list(body, "made"))
        enabled = tuple(_str(v) for v in _list(body, "enabled"))
    except (TypeError, KeyError) as e:
        raise JournalFormatError(f"not a limits journal: {e}") from e
    journal = Journal(
        _name(cgroup),
        changes,
        tuple(_name(n) for n in made),
        tuple(_name(n) if n else n for n in enabled),  # "" is the mount.
    )
    _check_changes(journal.changes)
    return journal


def _list(body: Mapping[str, Any], key: str) -> list[Any]:
    value = body[key]
    if not isinstance(value, list):
        raise TypeError(f"{key!r} is {type(value).__name__}, not a list")
    return value


def _text(body: Mapping[str, Any], key: str) -> str:
    if not isinstance(body, Mapping):
        raise TypeError(f"{body!r} is not an object")
    return _str(body[key])


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


def _name(text: str) -> CgroupName:
    """A name from the journal, refused as a request's is: the rollback acts on it."""
    try:
        return cgroup_name(text)
    except InvalidArgument as e:
        raise JournalFormatError(str(e)) from e


def _check_changes(changes: tuple[FileChange, ...]) -> None:
    """Refuse changes the rollback could not write back as they are: a file not a limit's, or
    a value the kernel would not take."""
    for change in changes:
        if change.file not in LIMIT_FILES:
            raise JournalFormatError(f"{quoted(change.file)} is not a memory limit file")
        for value in (change.old, change.new):
            if not limit_text_valid(value):
                raise JournalFormatError(
                    f"{change.file} value {quoted(value)} is not one the kernel takes "
                    "('max' or a decimal number of bytes)"
                )


def limit_text_valid(text: str) -> bool:
    """Whether a limit file would take this text as written back: 'max' or ASCII digits
    (a rollback writes it as root, so nothing else is written)."""
    return text == "max" or (0 < len(text) <= 20 and text.isascii() and text.isdigit())


def store(kernel: Kernel) -> StateFile:
    return state_file(kernel, LIMITS_JOURNAL)


def save(kernel: Kernel, journal: Journal) -> None:
    store(kernel).save(encode(journal))


def left_behind(kernel: Kernel) -> bool:
    """Whether a journal is there, valid or not, for the start to roll back (ops/limits.py's
    recover); else nothing of SetMemoryLimits needs to load at start."""
    return store(kernel).exists()


def load(kernel: Kernel) -> Journal | None:
    """The journal a call left; None if none, or if it was not one (then moved aside)."""
    return store(kernel).load_valid(decode)


def discard(kernel: Kernel) -> None:
    store(kernel).remove()
