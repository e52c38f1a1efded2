"""The SetMemoryLimits journal: a change in flight, written down in /run until it is done.

A write to memory.max reclaims down to the new limit before it returns, which can take
seconds, and the agent can die inside it (SIGKILL, the OOM killer, a guest kernel killing it)
with memory.swap.max already new and memory.low still old. So before the first change the
agent writes the cgroup and the old and new text of each file here, and removes the journal
once the files read back as the new values. An agent that starts and finds a journal rolls
the cgroup back to the old values rather than completing the change: the caller never got an
answer, so it will retry, and the old set is the one it last saw succeed. Cgroups the call
made are removed again, as an in-process rollback does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guestagent.errors import AgentError, InvalidArgument, NotFound
from guestagent.jsonlog import EventLog
from guestagent.linux.cgroups import (
    SUBTREE_CONTROL,
    CreatedCgroup,
    cgroup_dir,
    subtree_controllers,
    undo_create,
    validate_cgroup_name,
)
from guestagent.linux.fs import KernelFS

log = EventLog("guestagent.ops.limits_journal")

JOURNAL_FILE = "limits-journal.json"
FORMAT_VERSION = 1
CONTROLLER = "memory"
# The kernel's largest page count for a limit (LONG_MAX / PAGE_SIZE): it shows as "max", and
# any larger number written is stored as it.
_LONG_MAX = 2**63 - 1


class JournalFormatError(ValueError):
    """A journal this agent cannot read: written by a newer agent, or damaged."""


@dataclass(frozen=True)
class FileChange:
    file: str  # memory.max, memory.swap.max or memory.low
    old: str  # the text read before the call, as the kernel showed it
    new: str  # the text the call writes


@dataclass(frozen=True)
class Journal:
    cgroup: str  # relative to the cgroup2 mount, as the caller named it
    changes: tuple[FileChange, ...]  # in the order they are written
    # Cgroups the call makes, top down, and those whose cgroup.subtree_control gets
    # "+memory" ("" is the mount itself): what rolling back has to remove and disable.
    made: tuple[str, ...] = ()
    enabled: tuple[str, ...] = ()


def encode(journal: Journal) -> bytes:
    body = {
        "version": FORMAT_VERSION,
        "cgroup": journal.cgroup,
        "changes": [{"file": c.file, "old": c.old, "new": c.new} for c in journal.changes],
        "made": list(journal.made),
        "enabled": list(journal.enabled),
    }
    return json.dumps(body, indent=1).encode() + b"\n"


def decode(data: bytes) -> Journal:
    """The journal in `data`; JournalFormatError says what is wrong with it."""
    try:
        body = json.loads(data)
        if not isinstance(body, dict) or body.get("version") != FORMAT_VERSION:
            version = body.get("version") if isinstance(body, dict) else None
            raise JournalFormatError(f"version {version!r}, this agent reads {FORMAT_VERSION}")
        changes = tuple(
            FileChange(_text(c, "file"), _text(c, "old"), _text(c, "new"))
            for c in _list(body, "changes")
        )
        journal = Journal(
            cgroup=_text(body, "cgroup"),
            changes=changes,
            made=tuple(_str(v) for v in _list(body, "made")),
            enabled=tuple(_str(v) for v in _list(body, "enabled")),
        )
    except (ValueError, TypeError, KeyError) as e:
        if isinstance(e, JournalFormatError):
            raise
        raise JournalFormatError(f"not a limits journal: {e}") from e
    _check_names(journal)
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


def _check_names(journal: Journal) -> None:
    """Refuse a journal whose names could lead the rollback outside the mount or its files."""
    try:
        validate_cgroup_name(journal.cgroup)
        for name in journal.made:
            validate_cgroup_name(name)
        for name in journal.enabled:
            if name:
                validate_cgroup_name(name)
    except InvalidArgument as e:
        raise JournalFormatError(str(e)) from e
    for change in journal.changes:
        if change.file not in ("memory.max", "memory.swap.max", "memory.low"):
            raise JournalFormatError(f"{change.file!r} is not a memory limit file")


def kernel_pages(text: str, page_size: int) -> int:
    """What the kernel stores for a limit's text: whole pages, "max" as its largest count."""
    largest = _LONG_MAX // page_size
    value = text.strip()
    return largest if value == "max" else min(int(value) // page_size, largest)


def same_limit(a: str, b: str, page_size: int) -> bool:
    """True when the kernel holds the same limit for both texts (4097 and 4096 are one page)."""
    try:
        return kernel_pages(a, page_size) == kernel_pages(b, page_size)
    except ValueError:
        return a.strip() == b.strip()


def rollback_plan(
    journal: Journal, current: Mapping[str, str | None], page_size: int
) -> tuple[FileChange, ...]:
    """The writes that put the old values back, last written first, as an in-process rollback.

    Each is a FileChange from what the file holds now to its old value. Files already holding
    the old value, and files that are gone, are left alone.
    """
    writes = []
    for change in reversed(journal.changes):
        now = current.get(change.file)
        if now is not None and not same_limit(now, change.old, page_size):
            writes.append(FileChange(change.file, now.strip(), change.old))
    return tuple(writes)


def creation_plan(fs: KernelFS, cgroup: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What create_cgroup will do for `cgroup`, read before it does it: the cgroups it makes,
    top down, and the cgroups whose subtree_control it gives "+memory" ("" is the mount)."""
    parts = validate_cgroup_name(cgroup)
    names = ["/".join(parts[:depth]) for depth in range(len(parts) + 1)]
    made = tuple(name for name in names[1:] if not fs.is_dir(fs.cgroup_root / name))
    if not made:
        return (), ()
    enabled = tuple(name for name in names[:-1] if name in made or not _has_memory(fs, name))
    return made, enabled


def _has_memory(fs: KernelFS, name: str) -> bool:
    try:
        return CONTROLLER in subtree_controllers(fs, fs.cgroup_root / name)
    except AgentError:
        return False  # Not a cgroup: create_cgroup refuses it before changing anything.


def journal_path(fs: KernelFS) -> Path:
    return fs.run("guestagent", JOURNAL_FILE)


def save(fs: KernelFS, journal: Journal) -> None:
    """Write the journal whole or not at all: a temporary file, fsync, then rename over."""
    path = journal_path(fs)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{JOURNAL_FILE}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, encode(journal))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temporary, path)
    _sync_directory(path.parent)


def discard(fs: KernelFS) -> None:
    journal_path(fs).unlink(missing_ok=True)
    _sync_directory(journal_path(fs).parent)


def _sync_directory(directory: Path) -> None:
    # The rename or unlink is durable only once the directory is; a no-op on /run's tmpfs,
    # but it keeps the journal honest on a disk-backed /run.
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def page_size() -> int:
    return os.sysconf("SC_PAGE_SIZE")


def recover(fs: KernelFS) -> Journal | None:
    """At start: roll back the change a dead agent left in flight, log it, drop the journal.

    Returns the journal that was found, if any. Nothing here raises: a rollback that fails is
    logged with its errno, and the agent serves anyway, since refusing to start would leave
    the guest with no agent at all.
    """
    path = journal_path(fs)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        journal = decode(data)
        directory = cgroup_dir(fs, journal.cgroup)
    except (JournalFormatError, InvalidArgument) as e:
        log.error("limits_journal_unreadable", path=str(path), error=str(e))
        discard(fs)
        return None
    except NotFound:
        log.warning(
            "limits_journal_dropped",
            cgroup=journal.cgroup,
            reason="the cgroup no longer exists",
            changes=[vars(c) for c in journal.changes],
        )
        _undo_creation(fs, journal)
        discard(fs)
        return journal
    current = {c.file: _read(fs, directory / c.file) for c in journal.changes}
    restored: list[dict[str, str]] = []
    failed: list[dict[str, str]] = []
    for write in rollback_plan(journal, current, page_size()):
        entry = {"file": write.file, "from": write.old, "to": write.new}
        try:
            fs.write(directory / write.file, write.new)
            restored.append(entry)
        except AgentError as e:
            failed.append({**entry, "error": str(e)})
    undone = _undo_creation(fs, journal)
    if failed:
        log.error("limits_rollback_failed", cgroup=journal.cgroup, failed=failed)
    log.info(
        "limits_rolled_back",
        cgroup=journal.cgroup,
        restored=restored,
        failed=failed,
        old={c.file: c.old for c in journal.changes},
        new={c.file: c.new for c in journal.changes},
        found={f: v.strip() if v is not None else None for f, v in current.items()},
        undone=undone,
    )
    discard(fs)
    return journal


def _read(fs: KernelFS, path: Path) -> str | None:
    try:
        return fs.read_optional(path)
    except AgentError:
        return None


def _undo_creation(fs: KernelFS, journal: Journal) -> str | None:
    """Remove the cgroups the call made and disable what it enabled, where that happened."""
    if not journal.made and not journal.enabled:
        return None
    root = fs.cgroup_root
    made = tuple(root / name for name in journal.made if fs.is_dir(root / name))
    enabled = []
    for name in journal.enabled:
        control = root / name / SUBTREE_CONTROL
        try:
            if CONTROLLER in subtree_controllers(fs, control.parent):
                enabled.append(control)
        except AgentError:
            continue  # Gone with a directory the dead agent made, or never written.
    return undo_create(fs, CreatedCgroup(root / journal.cgroup, made, tuple(enabled), CONTROLLER))
