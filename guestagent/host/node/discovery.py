"""Finding the node's sandbox VMs on disk: the Kata runtimes' sandbox directories,
firecracker-containerd's VM directories and the declared file, rescanned whenever inotify says
one of them changed and every few seconds besides (a runtime installed after the daemon makes
its directory later; kata-monitor retries a missing one only every 60 s). A Kata sandbox
counts once its shim's socket exists: its directory comes first, the shim's server only once
the VM has booted, and a directory without one (runtime-rs's `firecracker/`) is no sandbox."""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from guestagent.host.node.config import ConfigError, Discovery, parse_declared
from guestagent.host.node.sandboxes import (
    FC_VSOCK,
    KATA_GO,
    KATA_RS,
    SHIM_SOCKET,
    Layout,
    Sandbox,
    firecracker_containerd_sandbox,
    kata_sandbox,
)
from guestagent.linux import syscalls

# A directory's entries came or went, or a file in it was written whole.
CHANGES = (
    syscalls.IN_CREATE
    | syscalls.IN_DELETE
    | syscalls.IN_MOVED_FROM
    | syscalls.IN_MOVED_TO
    | syscalls.IN_CLOSE_WRITE
)


@dataclass(frozen=True)
class Found:
    sandboxes: dict[str, Sandbox]  # By id.
    problems: tuple[str, ...]  # What could not be read, each once per scan.


def subdirectories(path: str) -> list[str]:
    """The directories in `path` (none when it does not exist yet)."""
    try:
        with os.scandir(path) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


def kata_candidates(layout: Layout, sandbox_id: str) -> list[str]:
    """The sockets whose presence says which VMM a Kata sandbox runs (sandboxes.kata_vmm)."""
    return [
        layout.path("run/vc/vm", sandbox_id, "clh-api.sock"),
        layout.path("run/vc/vm", sandbox_id, "qmp.sock"),
        layout.path("run/vc/firecracker", sandbox_id),
        layout.path("run/kata", sandbox_id, "ch-api.sock"),
        layout.path("run/kata/firecracker", sandbox_id),
    ]


def scan_kata(layout: Layout, source: str) -> list[Sandbox]:
    root = layout.kata_go if source == KATA_GO else layout.kata_rs
    found = []
    for sandbox_id in subdirectories(root):
        if not os.path.exists(os.path.join(root, sandbox_id, SHIM_SOCKET)):
            continue
        exists = {p for p in kata_candidates(layout, sandbox_id) if os.path.exists(p)}
        found.append(kata_sandbox(layout, source, sandbox_id, exists))
    return found


def scan_firecracker_containerd(layout: Layout, follow: bool, port: int) -> list[Sandbox]:
    found = []
    for name in subdirectories(layout.firecracker_containerd):
        vsock = os.path.join(layout.firecracker_containerd, name, FC_VSOCK)
        sandbox = firecracker_containerd_sandbox(layout, name, follow, port)
        if sandbox is not None and os.path.exists(vsock):
            found.append(sandbox)
    return found


class DeclaredFile:
    """The declared VMs, read again when the file changes. A file that cannot be read keeps
    the VMs it last declared (a typo must not drop every VM's loop), and says so."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._sandboxes: tuple[Sandbox, ...] = ()
        self.problem: str | None = None

    def read(self) -> tuple[Sandbox, ...]:
        try:
            stat = os.stat(self.path)
        except OSError as e:
            self.problem = f"declared VMs {self.path}: {e.strerror}; keeping the last list"
            return self._sandboxes
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                with open(self.path, encoding="utf-8") as file:
                    self._sandboxes = parse_declared(file.read(), self.path)
                self.problem = None
            except (OSError, UnicodeDecodeError, ConfigError) as e:
                self.problem = f"{e}; keeping the last list of {len(self._sandboxes)} VMs"
        return self._sandboxes


def merged(lists: Iterable[Iterable[Sandbox]]) -> Found:
    """One sandbox per id, the first source's; a second one is a problem named once."""
    sandboxes: dict[str, Sandbox] = {}
    problems = []
    for sandbox in (s for found in lists for s in found):
        first = sandboxes.setdefault(sandbox.id, sandbox)
        if first is not sandbox:
            problems.append(
                f"sandbox {sandbox.id!r} is found by both {first.source} and {sandbox.source}: "
                f"served as {first.source}'s"
            )
    return Found(sandboxes, tuple(problems))


class Finder:
    """Each scan's sandboxes, by the node's discovery policy."""

    def __init__(self, policy: Discovery, follow_fc_balloon: bool) -> None:
        self.policy = policy
        self.layout = policy.layout
        self.follow_fc_balloon = follow_fc_balloon
        self.declared = DeclaredFile(policy.declared) if policy.declared else None

    def roots(self) -> list[str]:
        """The directories whose entries are sandboxes: watched, with each sandbox in them."""
        roots = []
        if self.policy.kata:
            roots += [self.layout.kata_go, self.layout.kata_rs]
        if self.policy.firecracker_containerd:
            roots.append(self.layout.firecracker_containerd)
        return roots

    def scan(self) -> Found:
        lists: list[Iterable[Sandbox]] = []
        if self.policy.kata:
            lists += [scan_kata(self.layout, KATA_GO), scan_kata(self.layout, KATA_RS)]
        if self.policy.firecracker_containerd:
            port = self.policy.agent_port
            lists.append(scan_firecracker_containerd(self.layout, self.follow_fc_balloon, port))
        problems: tuple[str, ...] = ()
        if self.declared is not None:
            lists.append(self.declared.read())
            problems = (self.declared.problem,) if self.declared.problem else ()
        found = merged(lists)
        return Found(found.sandboxes, problems + found.problems)


class Wakeups:
    """inotify on the sandbox roots, each sandbox directory in them, and the declared file's
    directory: wait() returns early when one changes. Each call re-adds the watches, so a
    directory made since is watched from then on (adding a watch twice is one watch)."""

    def __init__(self, finder: Finder) -> None:
        self.finder = finder
        self.fd = syscalls.inotify_init()

    def _watch(self, path: str) -> None:
        with contextlib.suppress(OSError):  # Not there (yet): the periodic scan covers it.
            syscalls.inotify_add_watch(self.fd, path, CHANGES | syscalls.IN_ONLYDIR)

    def watch_all(self) -> None:
        for root in self.finder.roots():
            self._watch(root)
            for name in subdirectories(root):
                self._watch(os.path.join(root, name))
        if self.finder.declared is not None:
            self._watch(os.path.dirname(os.path.abspath(self.finder.declared.path)))

    def wait(self, seconds: float) -> bool:
        """True when something changed within `seconds`; the events are drained."""
        readable, _, _ = select.select([self.fd], [], [], seconds)
        if not readable:
            return False
        with contextlib.suppress(BlockingIOError):
            while os.read(self.fd, 64 * 1024):
                pass
        return True

    def close(self) -> None:
        os.close(self.fd)


def scanning(
    finder: Finder,
    found: Callable[[Found], None],
    stopped: Callable[[], bool],
    wait_seconds: float,
) -> None:
    """Scan, hand the result to `found`, wait for a change or `wait_seconds`; until stopped."""
    wakeups = Wakeups(finder)
    try:
        while not stopped():
            wakeups.watch_all()
            found(finder.scan())
            wakeups.wait(wait_seconds)
    finally:
        wakeups.close()
