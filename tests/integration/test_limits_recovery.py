"""The real daemon, started over a fake root that a dead agent left mid-change: it rolls the
cgroup back before it serves, and says so in its log."""

from __future__ import annotations

from pathlib import Path

from guestagent.host.client import AgentClient
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.ops import limits_journal
from guestagent.ops.limits_journal import FileChange, Journal
from guestagent.sizes import MIB
from tests.fakes.agentproc import AgentProcess
from tests.fakes.root import FakeRoot


def test_a_leftover_journal_is_rolled_back_before_serving(
    fake_root: FakeRoot, tmp_path: Path
) -> None:
    ctr = fake_root.add_cgroup("pod/ctr", max_=str(32 * MIB))
    (ctr / "memory.swap.max").write_text(f"{96 * MIB}\n")
    limits_journal.save(
        fake_root.fs,
        Journal(
            cgroup_name("pod/ctr"),
            (
                FileChange("memory.swap.max", "max", str(96 * MIB)),
                FileChange("memory.max", "max", str(32 * MIB)),
                FileChange("memory.low", "0", str(16 * MIB)),
            ),
        ),
    )
    process = AgentProcess(fake_root.root, tmp_path)
    process.start()
    try:
        with AgentClient(process.unix_target) as client:
            (reported,) = client.info(["pod/ctr"]).cgroups
    finally:
        process.kill()
    assert reported.max.unlimited and reported.swap_max.unlimited and reported.low_bytes == 0
    assert not limits_journal.store(fake_root.fs).exists()
    events = [e for e in process.log_events() if e["event"] == "limits_rolled_back"]
    assert len(events) == 1
    assert events[0]["restored"] == [
        {"file": "memory.max", "from": str(32 * MIB), "to": "max"},
        {"file": "memory.swap.max", "from": str(96 * MIB), "to": "max"},
    ]
    # Logged before the listeners opened: no caller saw the half-applied limits.
    names = [e["event"] for e in process.log_events()]
    assert names.index("limits_rolled_back") < names.index("serving")
