"""The agent's own state under /run/guestagent: a JSON file per store, saved whole or not at all.

/run outlives an agent restart but not a reboot, as the kernel state these files describe
does. A save writes a temporary file in the same directory, fsyncs it, renames it over the
old one and fsyncs the directory. The directory is made 0700 and each file 0600, and both
are opened without following symlinks: a directory someone else could write to, or a link
planted in it, is refused rather than trusted, since what is read here is acted on as root.

Every store is read through `load_valid`, with a decoder that checks the value's shape: a
file that cannot be read as one of ours, or that its decoder refuses, is moved aside
(`NAME.corrupt-TIME`), logged once, and the agent starts without it; an agent that fails at
every start is worse for a guest than one that forgot a policy. A directory that is not the
agent's own (a symlink, another owner, writable by others, not a directory) is refused once at
start (`check_directory`): the agent then serves without persisting, and says so.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from guestagent.errors import AgentError, FailedPrecondition, errno_text
from guestagent.jsonlog import EventLog
from guestagent.linux.fs import KernelFS
from guestagent.records import record

log = EventLog("guestagent.statestore")
T = TypeVar("T")

STATE_DIRECTORY = "guestagent"
# The stores, one file each.
SWAPS = "swaps.json"
RECLAIM_POLICIES = "reclaim-policy.json"
LIMITS_JOURNAL = "limits-journal.json"
# The stores hold a few entries; anything larger is not one of ours.
MAX_BYTES = 1 << 20
_NOT_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH
_FILE_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW
# Our stores nest three deep; a value nested deeper is not one of ours (and a deep enough one
# exhausts the parser's recursion).
MAX_DEPTH = 16
_MISSING = object()
_TRANSIENT = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR)
# Directories refused at start, with why: nothing is read from or written to them.
_refused: dict[str, str] = {}
_refused_lock = threading.Lock()


class StateFileError(FailedPrecondition):
    """A state file, or its directory, that cannot be read or written as one of ours."""

    default_reason = "STATE_UNUSABLE"


@record
class StateFile:
    path: str

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def load_valid(self, decode: Callable[[Any], T]) -> T | None:
        """The decoded value saved last; None when nothing is saved, when the directory was
        refused, or when the file is not one of ours (then it is moved aside and logged)."""
        if refused(self.directory):
            return None
        try:
            value = self._read()
            return None if value is _MISSING else decode(value)
        except (StateFileError, AgentError, ValueError, TypeError, KeyError, RecursionError) as e:
            if getattr(e, "errno", None) in _TRANSIENT:
                # Out of descriptors or memory says nothing about the file: keep it.
                log.warning("state_file_unreadable", path=self.path, error=str(e))
                return None
            self._move_aside(str(e))
            return None

    def _move_aside(self, why: str) -> None:
        aside = f"{self.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        try:
            directory = _open_directory(self.directory, create=False)
            try:
                os.rename(self.name, aside, src_dir_fd=directory, dst_dir_fd=directory)
                os.fsync(directory)
            finally:
                os.close(directory)
        except (OSError, StateFileError) as e:
            log.error("state_file_corrupt", path=self.path, error=why, not_moved=str(e))
            return
        log.error("state_file_corrupt", path=self.path, error=why, moved_to=aside)

    def exists(self) -> bool:
        """Whether there is a file, valid or not: the part whose state it is loads at start
        only then (swap, the reclaimer)."""
        return os.path.lexists(self.path)

    def load(self) -> Any:
        """The JSON value saved last; None when nothing is saved."""
        value = self._read()
        return None if value is _MISSING else value

    def _read(self) -> Any:
        try:
            directory = _open_directory(self.directory, create=False)
        except FileNotFoundError:
            return _MISSING
        except OSError as e:
            raise self._error("open the directory of", e) from e
        try:
            fd = os.open(self.name, os.O_RDONLY | os.O_NONBLOCK | _FILE_FLAGS, dir_fd=directory)
        except FileNotFoundError:
            return _MISSING
        except OSError as e:
            raise self._error("open", e) from e
        finally:
            os.close(directory)
        try:
            _check_owned(fd, self.path, stat.S_ISREG, "a regular file")
            data = os.read(fd, MAX_BYTES + 1)
        except OSError as e:
            raise self._error("read", e) from e
        finally:
            os.close(fd)
        if len(data) > MAX_BYTES:
            raise StateFileError(f"{self.path} is over {MAX_BYTES} bytes: not a state file")
        if nesting(data) > MAX_DEPTH:
            raise StateFileError(f"{self.path} nests over {MAX_DEPTH} deep: not a state file")
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:  # UnicodeError is a ValueError.
            raise StateFileError(f"{self.path} is not valid JSON: {e}") from None

    def save(self, value: Any) -> None:
        """Write value whole; nothing when the directory was refused at start."""
        if refused(self.directory):
            return
        data = json.dumps(value, indent=1).encode() + b"\n"
        temporary = f".{self.name}.tmp"
        try:
            directory = _open_directory(self.directory, create=True)
        except OSError as e:
            raise self._error("open the directory of", e) from e
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=directory)  # Left by an agent killed mid-save.
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS
            fd = os.open(temporary, flags, 0o600, dir_fd=directory)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temporary, self.name, src_dir_fd=directory, dst_dir_fd=directory)
            os.fsync(directory)
        except OSError as e:
            raise self._error("write", e) from e
        finally:
            os.close(directory)

    def save_or_remove(self, value: dict[str, Any]) -> None:
        """Save a state that holds something; remove the file for an empty one. Whether the
        file exists decides whether its part loads at start (swap, the reclaimer), so a part
        that was only asked, or whose last entry went, must not leave `{}` behind."""
        if value:
            self.save(value)
        else:
            self.remove()

    def remove(self) -> None:
        if refused(self.directory):
            return
        try:
            directory = _open_directory(self.directory, create=False)
        except FileNotFoundError:
            return
        except OSError as e:
            raise self._error("open the directory of", e) from e
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.name, dir_fd=directory)
            os.fsync(directory)
        except OSError as e:
            raise self._error("remove", e) from e
        finally:
            os.close(directory)

    def _error(self, op: str, e: OSError) -> StateFileError:
        why = " (a symlink, refused)" if e.errno == errno.ELOOP else ""
        error = StateFileError(f"cannot {op} {self.path}: {errno_text(e)}{why}")
        error.errno = e.errno
        return error


def state_file(fs: KernelFS, name: str) -> StateFile:
    return StateFile(fs.run(STATE_DIRECTORY, name))


def nesting(data: bytes) -> int:
    """How deep the JSON text's arrays and objects nest (brackets inside strings count too:
    an over-estimate is only a refusal of an odd file)."""
    depth = deepest = 0
    for byte in data:
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


def check_directory(fs: KernelFS) -> str:
    """At start: make the state directory (0700) if missing, and trust it only if it is this
    user's own directory that no one else may write; "" if it is, else why not (logged)."""
    path = fs.run(STATE_DIRECTORY)
    try:
        os.close(_open_directory(path, create=True))
    except (OSError, StateFileError) as e:
        text = errno_text(e) if isinstance(e, OSError) and e.errno is not None else str(e)
        if isinstance(e, OSError) and e.errno == errno.ELOOP:
            text += " (a symlink)"
        why = f"{path} refused: {text}; the agent does not persist its state"
        with _refused_lock:
            _refused[path] = why
        log.error("state_directory_refused", path=path, error=text)
        return why
    with _refused_lock:
        _refused.pop(path, None)
    return ""


def refused(directory: str) -> str:
    """Why the agent does not persist to this directory, "" if it does."""
    with _refused_lock:
        return _refused.get(directory, "")


def state_unavailable(fs: KernelFS) -> str:
    return refused(fs.run(STATE_DIRECTORY))


def _open_directory(path: str, create: bool) -> int:
    """The state directory, made 0700 if asked, refused unless it is this user's own."""
    if create:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _FILE_FLAGS)
    try:
        _check_owned(fd, path, stat.S_ISDIR, "a directory")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_owned(fd: int, path: str, is_kind: Callable[[int], bool], kind: str) -> None:
    info = os.fstat(fd)
    if not is_kind(info.st_mode):
        raise StateFileError(f"{path} is not {kind}")
    if info.st_uid != os.geteuid() or info.st_mode & _NOT_BY_OTHERS:
        raise StateFileError(
            f"{path} is owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):o}: "
            f"state must be uid {os.geteuid()}'s and writable by no one else"
        )


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
