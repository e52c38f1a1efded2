"""The multi-gen LRU's debugfs file, /sys/kernel/debug/lru_gen: its generations per memcg and
node (read), and its aging and eviction commands (write).

The format is mm/vmscan.c's lru_gen_seq_show (Documentation/admin-guide/mm/multigen_lru.rst):
"memcg <id> <path>", then per node " node <nid>", then per generation, oldest first,
"<seq> <age_ms> <anon_pages> <file_pages>". Writing "+ <memcg_id> <nid> <max_seq> 1 1" ages a
generation list: it walks the page tables of the memcg's processes and opens a new youngest
generation (the last two numbers: scan anon as well, and age even with MAX_NR_GENS in use).
Writing "- <memcg_id> <nid> <seq> <swappiness> <nr_to_reclaim>" evicts the generations up to
seq, oldest first, until nr_to_reclaim pages are reclaimed (mm/vmscan.c run_eviction); the
kernel cannot be stopped mid-write except by a signal, so the count bounds each write.

debugfs is often not mounted in a guest: `debugfs` mounts it for one use when it is not and
unmounts it after, so the guest's mount table is left as found. The agent's threads (the
aging loop, the reclaimer's evictions) share one mount while any of them uses it: one that
unmounted under another's open would fail the other's write.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from guestagent.errors import AgentError, KernelFormat, kernel_error
from guestagent.linux import syscalls
from guestagent.linux.features import MGLRU, Absent, read_idle_ages_absence
from guestagent.linux.fs import KernelFS
from guestagent.records import record

DEBUGFS = "debugfs"
# The two youngest generations are not fully aged (the equivalent of the active list): the
# kernel refuses to evict them (mm/vmscan.c run_eviction, MIN_NR_GENS).
MIN_NR_GENS = 2
# An eviction's swappiness: file pages only, or anonymous pages before file ones (the
# command's largest value; mm/vmscan.c isolate_folios takes anon first at it).
FILE_ONLY = 0
ANON_FIRST = 200


@record
class Generation:
    seq: int
    age_ms: int  # Since the generation was opened.
    anon_pages: int
    file_pages: int


@record
class Lruvec:
    """One memcg's generations on one NUMA node, oldest first."""

    memcg_id: int
    path: str  # As the kernel prints it: "/" for the root, "/pod1/ctr1" below it.
    node: int
    generations: tuple[Generation, ...]

    @property
    def max_seq(self) -> int:
        return self.generations[-1].seq

    def evictable(self, seq: int) -> bool:
        """Whether the kernel evicts generation `seq` of this lruvec."""
        return seq + MIN_NR_GENS <= self.max_seq


@record
class Eviction:
    """One eviction command: up to `pages` pages of the memcg's generations up to `seq` on
    the node, anonymous ones (into swap) before file ones when `anon`, else file ones only."""

    memcg_id: int
    node: int
    seq: int
    anon: bool
    pages: int


def _number(text: str, line: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise KernelFormat(f"lru_gen line {line!r} is malformed") from None


def parse_lru_gen(text: str) -> tuple[Lruvec, ...]:
    """Every memcg and node with its generations; a memcg with no generation is left out."""
    found: list[Lruvec] = []
    memcg: tuple[int, str] | None = None
    node: int | None = None
    generations: list[Generation] = []

    def close() -> None:
        if memcg is not None and node is not None and generations:
            found.append(Lruvec(memcg[0], memcg[1], node, tuple(generations)))

    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "memcg":
            close()
            # The path is the rest of the line: a cgroup's name may hold spaces.
            parts = line.split(maxsplit=2)
            if len(parts) < 2:
                raise KernelFormat(f"lru_gen line {line!r} is malformed")
            # A memcg whose path the kernel could not print (the root without CONFIG_MEMCG).
            path = parts[2] if len(parts) == 3 else "/"
            memcg, node, generations = (_number(parts[1], line), path), None, []
        elif fields[0] == "node":
            close()
            if memcg is None or len(fields) != 2:
                raise KernelFormat(f"lru_gen line {line!r} is outside a memcg")
            node, generations = _number(fields[1], line), []
        else:
            if node is None or len(fields) < 4:
                raise KernelFormat(f"lru_gen line {line!r} is outside a node")
            # Full mode marks a type's retired generation with an "x": a trailing flag.
            seq, age, anon, file = (_number(f.rstrip("x"), line) for f in fields[:4])
            generations.append(Generation(seq, age, anon, file))
    close()
    return tuple(found)


def aging_command(lruvecs: tuple[Lruvec, ...]) -> str:
    """One write that ages every listed lruvec from its current youngest generation (a stale
    max_seq is a no-op for the kernel, so a race with its own aging does no harm)."""
    return ";".join(f"+ {v.memcg_id} {v.node} {v.max_seq} 1 1" for v in lruvecs)


def eviction_command(eviction: Eviction) -> str:
    swappiness = ANON_FIRST if eviction.anon else FILE_ONLY
    e = eviction
    return f"- {e.memcg_id} {e.node} {e.seq} {swappiness} {e.pages}"


def lru_gen_path(fs: KernelFS) -> str:
    return fs.sys("kernel", "debug", "lru_gen")


def debugfs_absence(fs: KernelFS) -> Absent | None:
    """Why the generations cannot be read (or mean nothing): the multi-gen LRU is off,
    missing or walks no page tables, or debugfs is missing."""
    mglru = read_idle_ages_absence(fs)
    if mglru is not None:
        return mglru
    if fs.exists(lru_gen_path(fs)):
        return None
    filesystems = fs.read_optional(fs.proc("filesystems")) or ""
    if not any(line.split()[-1:] == [DEBUGFS] for line in filesystems.splitlines()):
        return Absent(
            MGLRU, "the idle ages need debugfs (CONFIG_DEBUG_FS), which this kernel lacks"
        )
    if not fs.is_real:
        return Absent(MGLRU, f"{lru_gen_path(fs)} is missing")
    return None


class SharedMount:
    """A mount the agent's threads share: the first that needs it mounts it, the last to leave
    unmounts it, and one found mounted by someone else is left alone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._mounted = False

    def enter(self, present: Callable[[], bool], mount: Callable[[], None]) -> None:
        with self._lock:
            if not self._mounted and not present():
                mount()
                self._mounted = True
            self._users += 1

    def leave(self, unmount: Callable[[], None]) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._mounted:
                self._mounted = False
                unmount()


_DEBUGFS = SharedMount()


@contextmanager
def debugfs(fs: KernelFS, path: str | None = None) -> Iterator[str]:
    """A debugfs path (lru_gen's unless given), with debugfs mounted for the duration if the
    path is not there (then unmounted once no thread of the agent uses it). AgentError
    naming the mount when it cannot be mounted (e.g. kernel lockdown)."""
    path = lru_gen_path(fs) if path is None else path
    if not fs.is_real:
        yield path
        return
    where = fs.sys("kernel", "debug")
    mountpoint = os.fspath(where)

    def mount() -> None:
        try:
            syscalls.mount(DEBUGFS, mountpoint, DEBUGFS, syscalls.MS_NOSUID | syscalls.MS_NODEV)
        except OSError as e:
            raise kernel_error("mount debugfs on", where, None, e) from e

    def unmount() -> None:
        try:
            syscalls.umount(mountpoint)
        except OSError as e:
            # Busy: someone outside the agent started using it meanwhile; theirs to unmount.
            if e.errno != errno.EBUSY:
                raise

    _DEBUGFS.enter(lambda: fs.exists(path), mount)
    try:
        yield path
    finally:
        _DEBUGFS.leave(unmount)


def read_lruvecs(fs: KernelFS, path: str) -> tuple[Lruvec, ...]:
    return fs.read_parsed(path, parse_lru_gen)


def write_aging(fs: KernelFS, path: str, lruvecs: tuple[Lruvec, ...]) -> None:
    """Age every lruvec; one that went away meanwhile (EINVAL: its memcg died) is skipped."""
    if not lruvecs:
        return
    try:
        fs.write(path, aging_command(lruvecs))
    except AgentError as e:
        if e.errno != errno.EINVAL:
            raise
        # The kernel stops at the first bad command: the rest go one by one.
        for one in lruvecs:
            try:
                fs.write(path, aging_command((one,)))
            except AgentError as each:
                if each.errno != errno.EINVAL:
                    raise


def write_eviction(fs: KernelFS, path: str, eviction: Eviction) -> bool:
    """Evict as the command says; False when the kernel refused it (EINVAL: the memcg died, or
    the generation is no longer evictable)."""
    try:
        fs.write(path, eviction_command(eviction))
    except AgentError as e:
        if e.errno != errno.EINVAL:
            raise
        return False
    return True
