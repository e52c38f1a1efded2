from __future__ import annotations

import logging
from pathlib import Path

import pytest

from guestagent.agent import cli
from guestagent.linux.cgroup.procs import own_cgroup
from guestagent.ops import self_cgroup
from guestagent.ops.self_cgroup import (
    MEMORY_HIGH,
    MEMORY_MIN,
    Action,
    decide,
    lock_self,
    protect_self,
)
from tests.fakes.cgroups import FakeCgroupKernel
from tests.fakes.root import FakeRoot

ROOT_CONTROLLERS = "cpuset cpu io memory pids"


class FakeKernel(FakeCgroupKernel):
    """Every cgroup also gets cgroup.procs, which the agent writes its pid to."""

    def _populate(self, directory: Path) -> None:
        super()._populate(directory)
        (directory / "cgroup.procs").write_text("")


IN_ROOT = "0::/\n"


@pytest.mark.parametrize(
    ("euid", "proc", "controllers", "has_type", "action", "words"),
    [
        (0, IN_ROOT, ROOT_CONTROLLERS, False, Action.MOVE, "root cgroup"),
        (0, "0::/kata-agent\n", ROOT_CONTROLLERS, "shared", Action.MOVE, "sharing its cgroup"),
        (0, "0::/guestagent\n", ROOT_CONTROLLERS, False, Action.MOVE, "already in its cgroup"),
        (0, "0::/system.slice/ga.service\n", ROOT_CONTROLLERS, False, Action.STAY, "unit"),
        (1000, IN_ROOT, ROOT_CONTROLLERS, False, Action.SKIP, "not running as root"),
        (0, IN_ROOT, None, False, Action.SKIP, "not a cgroup2 root"),
        # In a cgroup namespace the mount shows a non-root cgroup, which has cgroup.type.
        (0, IN_ROOT, ROOT_CONTROLLERS, True, Action.SKIP, "not a cgroup2 root"),
        (0, IN_ROOT, "cpu io pids", False, Action.SKIP, "no memory controller"),
        (0, "1:cpu:/\n", ROOT_CONTROLLERS, False, Action.SKIP, "in no cgroup2 cgroup"),
        (0, None, ROOT_CONTROLLERS, False, Action.SKIP, "in no cgroup2 cgroup"),
    ],
)
def test_decide(
    euid: int,
    proc: str | None,
    controllers: str | None,
    has_type: bool | str,
    action: Action,
    words: str,
) -> None:
    shared = has_type == "shared"
    decision = decide(euid, own_cgroup(proc or ""), controllers, has_type is True, shared)
    assert decision.action is action
    assert words in decision.reason


@pytest.fixture
def guest(fake_root: FakeRoot) -> FakeRoot:
    """A guest whose agent runs in the root cgroup, as the image's shell init starts it."""
    FakeKernel(fake_root).install()
    fake_root.write("sys/fs/cgroup/cgroup.controllers", ROOT_CONTROLLERS + "\n")
    fake_root.write("sys/fs/cgroup/cgroup.subtree_control", "cpu\n")
    fake_root.write("proc/self/cgroup", IN_ROOT)
    return fake_root


def agent_files(fake: FakeRoot) -> dict[str, str]:
    directory = fake.root / "sys/fs/cgroup/guestagent"
    return {n: (directory / n).read_text() for n in ("cgroup.procs", "memory.min", "memory.high")}


def test_moves_itself_and_sets_its_protection(
    guest: FakeRoot, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        decision = protect_self(guest.fs, pid=4242, euid=0)
    assert decision.action is Action.MOVE
    assert agent_files(guest) == {
        "cgroup.procs": "4242",
        "memory.min": str(24 << 20),
        "memory.high": str(80 << 20),
    }
    assert (guest.root / "sys/fs/cgroup/cgroup.subtree_control").read_text() == "+memory"
    (record,) = [r for r in caplog.records if r.getMessage() == "self_cgroup"]
    fields = vars(record)["fields"]
    assert fields["action"] == "move" and fields["moved_from"] == "/"
    assert (fields["memory_min"], fields["memory_high"]) == (MEMORY_MIN, MEMORY_HIGH)


def test_a_restart_moves_into_the_existing_cgroup(guest: FakeRoot) -> None:
    protect_self(guest.fs, pid=1, euid=0)
    protect_self(guest.fs, pid=2, euid=0)
    assert agent_files(guest)["cgroup.procs"] == "2"


@pytest.mark.parametrize(
    ("proc", "euid"), [("0::/system.slice/guestagent.service\n", 0), (IN_ROOT, 1000)]
)
def test_leaves_everything_alone_otherwise(
    guest: FakeRoot, proc: str, euid: int, caplog: pytest.LogCaptureFixture
) -> None:
    guest.write("proc/self/cgroup", proc)
    with caplog.at_level(logging.INFO):
        decision = protect_self(guest.fs, pid=4242, euid=euid)
    assert decision.action is not Action.MOVE
    assert not (guest.root / "sys/fs/cgroup/guestagent").exists()
    (record,) = [r for r in caplog.records if r.getMessage() == "self_cgroup"]
    assert vars(record)["fields"]["reason"] == decision.reason


def test_started_by_kata_agent_it_moves_out_of_kata_agents_cgroup(guest: FakeRoot) -> None:
    """An extension's processes start in kata-agent's cgroup: the agent takes its own, with
    the same bounds as everywhere, and leaves kata-agent where it was."""
    guest.write("proc/self/cgroup", "0::/kata-agent.service\n")
    guest.write("sys/fs/cgroup/kata-agent.service/cgroup.procs", "300\n4242\n")
    decision = protect_self(guest.fs, pid=4242, euid=0)
    assert (decision.action, decision.current) == (Action.MOVE, "/kata-agent.service")
    assert agent_files(guest)["cgroup.procs"] == "4242"
    assert agent_files(guest)["memory.min"] == str(MEMORY_MIN)


def test_alone_in_a_units_cgroup_it_stays(guest: FakeRoot) -> None:
    guest.write("proc/self/cgroup", "0::/system.slice/guestagent.service\n")
    guest.write("sys/fs/cgroup/system.slice/guestagent.service/cgroup.procs", "4242\n")
    assert protect_self(guest.fs, pid=4242, euid=0).action is Action.STAY


def test_in_a_cgroup_namespace_it_reads_nothing_outside_the_mount(guest: FakeRoot) -> None:
    """There /proc/self/cgroup may name a path above the mount ('/../x'): the agent skips,
    and never opens that path (a '..' the kernel files refuse)."""
    guest.write("proc/self/cgroup", "0::/../sibling\n")
    guest.write("sys/fs/cgroup/cgroup.type", "domain\n")
    decision = protect_self(guest.fs, pid=4242, euid=0)
    assert (decision.action, decision.reason) == (
        Action.SKIP,
        "the cgroup mount is not a cgroup2 root",
    )


def test_a_failure_is_logged_not_fatal(guest: FakeRoot, caplog: pytest.LogCaptureFixture) -> None:
    FakeKernel(guest, fail_mkdir="guestagent").install()
    with caplog.at_level(logging.INFO):
        decision = protect_self(guest.fs, pid=4242, euid=0)
    assert decision.action is Action.SKIP
    assert "ENOSPC" in decision.reason
    assert [r.getMessage() for r in caplog.records] == ["self_cgroup_failed"]


@pytest.fixture
def in_process_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """cli.main run in the test's own process must not set the agent's process-wide
    settings on it: huge pages refused (inherited by every later test's children) and the
    malloc arena limit."""
    monkeypatch.setattr(cli, "refuse_huge_pages", lambda: True)
    monkeypatch.setattr(cli, "limit_malloc_arenas", lambda arenas: None)


@pytest.mark.usefixtures("in_process_cli")
def test_cli_protects_itself_before_loading_the_daemon(
    guest: FakeRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    calls: list[tuple[Path, bool]] = []

    def protect(fs: object) -> None:
        calls.append((guest.root, "guestagent.agent.daemon" in sys.modules))
        raise SystemExit(7)  # Stop before serving.

    monkeypatch.setattr(cli, "protect_self", protect)
    monkeypatch.delitem(sys.modules, "guestagent.agent.daemon", raising=False)
    with pytest.raises(SystemExit):
        cli.main(["serve", "--root", str(guest.root)])
    assert calls == [(guest.root, False)]


@pytest.mark.usefixtures("in_process_cli")
def test_cli_flag_turns_it_off(guest: FakeRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "protect_self", lambda fs: pytest.fail("protect_self was called"))

    async def no_serve(config: object) -> None:
        raise SystemExit(0)

    import guestagent.agent.daemon as daemon

    monkeypatch.setattr(daemon, "serve", no_serve)
    with pytest.raises(SystemExit):
        cli.main(["serve", "--root", str(guest.root), "--no-self-cgroup"])
    assert self_cgroup.AGENT_CGROUP not in {
        p.name for p in (guest.root / "sys/fs/cgroup").iterdir()
    }


def test_serving_a_test_tree_locks_nothing(fake_root: FakeRoot) -> None:
    # The tests' agents run over fake trees on the development host: none of them pins its
    # pages there (lock_memory is tested in tests/unit/linux/test_syscalls.py).
    assert not fake_root.fs.is_real
    assert lock_self(fake_root.fs) is False
