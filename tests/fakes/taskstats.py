"""Delay accounting as taskstats would answer it, for the stall meter's unit tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from guestagent.errors import AgentError
from guestagent.linux.taskstats import TaskDelays


@dataclass
class FakeTaskstats:
    """Per tgid: the memory delay so far (ns, all counted as thrashing) and its age (us).
    `down` makes every query fail as a kernel without taskstats would."""

    memory_ns: dict[int, int] = field(default_factory=dict)
    elapsed_us: dict[int, int] = field(default_factory=dict)
    down: str = ""
    queries: int = 0

    def delays(self, tgid: int) -> TaskDelays | None:
        self.queries += 1
        if self.down:
            raise AgentError(self.down)
        if tgid not in self.memory_ns:
            return None
        stalled = self.memory_ns[tgid]
        return TaskDelays(13, self.elapsed_us.get(tgid, 10**9), 0, 0, stalled, 0)

    def stall(self, tgid: int, us: int) -> None:
        self.memory_ns[tgid] = self.memory_ns.get(tgid, 0) + us * 1000


def put_procs(directory: Path, *tgids: int) -> None:
    """cgroup.procs of a fake cgroup directory."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup.procs").write_text("".join(f"{t}\n" for t in tgids))
