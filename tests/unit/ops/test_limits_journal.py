from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from guestagent.errors import Aborted, FailedPrecondition
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.ops import limits, limits_journal
from guestagent.ops.limits import (
    MemorySpec,
    SetLimitsSpec,
    apply_memory_limits,
    recover,
    rollback_plan,
)
from guestagent.ops.limits_journal import (
    FileChange,
    Journal,
    JournalFormatError,
    decode,
    encode,
)
from guestagent.sizes import MIB
from tests.fakes.cgroups import FakeCgroupKernel
from tests.fakes.root import FakeRoot, Proceed

GiB = 1024 * MIB
PAGE = 4096
SPEC = MemorySpec(limit=64 * MIB, swap=GiB, reservation=16 * MIB)
OLD = {"memory.max": "max", "memory.swap.max": "max", "memory.low": "0"}
NEW = {
    "memory.max": str(64 * MIB),
    "memory.swap.max": str(GiB - 64 * MIB),
    "memory.low": str(16 * MIB),
}
JOURNAL = Journal(
    cgroup_name("pod/ctr"),
    (
        FileChange("memory.swap.max", "max", NEW["memory.swap.max"]),
        FileChange("memory.max", "max", NEW["memory.max"]),
        FileChange("memory.low", "0", NEW["memory.low"]),
    ),
)


class SimulatedKill(BaseException):
    """What SIGKILL does to the agent, as far as the files can tell: nothing runs after it."""


def journal_path(fake_root: FakeRoot) -> Path:
    return Path(limits_journal.store(fake_root.fs).path)


def limit_files(directory: Path) -> dict[str, str]:
    return {name: (directory / name).read_text().strip() for name in OLD}


def events(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    return [vars(r)["fields"] for r in caplog.records if r.getMessage() == event]


@pytest.fixture
def ctr(fake_root: FakeRoot) -> Path:
    return fake_root.add_cgroup("pod/ctr")


# The pure half: the journal's text, and what to write to roll back.


@pytest.mark.parametrize(
    "journal",
    [
        JOURNAL,
        Journal(cgroup_name("ctr"), ()),
        Journal(
            cgroup_name("pod/new"),
            (FileChange("memory.max", "max", "4096"),),
            (cgroup_name("pod"), cgroup_name("pod/new")),
            ("",),
        ),
    ],
)
def test_encode_decode_round_trip(journal: Journal) -> None:
    assert decode(encode(journal)) == journal


@pytest.mark.parametrize(
    ("body", "words"),
    [
        pytest.param([], "version None", id="not an object"),
        pytest.param({"version": 2}, "version 2", id="newer agent"),
        pytest.param(
            {"version": 1, "cgroup": "x", "changes": {}, "made": [], "enabled": []},
            "not a list",
            id="changes not a list",
        ),
        pytest.param(
            {**encode(Journal(cgroup_name("ctr"), ())), "cgroup": "../etc"},
            "'..' component",
            id="cgroup escapes",
        ),
        pytest.param(
            encode(Journal(cgroup_name("ctr"), (FileChange("cgroup.procs", "1", "2"),))),
            "'cgroup.procs' is not a memory limit file",
            id="other file",
        ),
        pytest.param(
            {**encode(Journal(cgroup_name("ctr"), ())), "made": ["/abs"]},
            "absolute",
            id="made absolute",
        ),
        pytest.param(
            {**encode(Journal(cgroup_name("ctr"), ())), "enabled": ["", "a/./b"]},
            "'.' component",
            id="enabled escapes",
        ),
        pytest.param(
            {"version": 1, "cgroup": 7, "changes": [], "made": [], "enabled": []},
            "7 is not a string",
            id="cgroup not a string",
        ),
    ],
)
def test_decode_refuses(body: object, words: str) -> None:
    with pytest.raises(JournalFormatError, match=words):
        decode(body)


def test_rollback_plan_restores_last_written_first() -> None:
    current = dict(NEW)
    assert rollback_plan(JOURNAL, current, PAGE) == (
        FileChange("memory.low", NEW["memory.low"], "0"),
        FileChange("memory.max", NEW["memory.max"], "max"),
        FileChange("memory.swap.max", NEW["memory.swap.max"], "max"),
    )


def test_rollback_plan_of_a_kill_inside_memory_max() -> None:
    """The kernel sets memory.max before it reclaims, so a kill there leaves low untouched."""
    current = {**NEW, "memory.low": "0\n"}
    assert [w.file for w in rollback_plan(JOURNAL, current, PAGE)] == [
        "memory.max",
        "memory.swap.max",
    ]


def test_rollback_plan_skips_old_and_missing_files() -> None:
    current: dict[str, str | None] = {
        "memory.swap.max": None,
        "memory.max": "max",
        "memory.low": "0",
    }
    assert rollback_plan(JOURNAL, current, PAGE) == ()


# The journal around SetMemoryLimits.


def test_journal_is_written_before_the_first_write_and_removed_after(
    fake_root: FakeRoot, ctr: Path
) -> None:
    seen: list[Journal | None] = []

    def look(path: Path, value: str, proceed: Proceed) -> None:
        seen.append(limits_journal.load(fake_root.fs))
        proceed(value)

    fake_root.kernel.on("write", look)
    apply_memory_limits(fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), SPEC))
    assert seen == [JOURNAL] * 3
    assert not journal_path(fake_root).exists()
    assert limit_files(ctr) == NEW


def test_journal_file_is_private_and_has_no_leftovers(fake_root: FakeRoot, ctr: Path) -> None:
    limits_journal.save(fake_root.fs, JOURNAL)
    path = journal_path(fake_root)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(path.parent).st_mode & 0o777 == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == ["limits-journal.json"]
    limits_journal.discard(fake_root.fs)
    assert list(path.parent.iterdir()) == []


def test_no_journal_when_nothing_changes(
    fake_root: FakeRoot, ctr: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saves: list[Journal] = []
    monkeypatch.setattr(limits_journal, "save", lambda fs, journal: saves.append(journal))
    apply_memory_limits(fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec()))
    assert saves == []


def test_journal_removed_after_an_in_process_rollback(fake_root: FakeRoot, ctr: Path) -> None:
    fake_root.kernel.fail("write", "memory.low", errno.EACCES)
    with pytest.raises(Aborted, match=r"restored memory\.max to max"):
        apply_memory_limits(fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), SPEC))
    assert not journal_path(fake_root).exists()
    assert limit_files(ctr) == OLD


def test_unwritable_journal_refuses_before_any_change(fake_root: FakeRoot, ctr: Path) -> None:
    fake_root.write("run/guestagent", "a file where the directory should be")
    with pytest.raises(FailedPrecondition) as raised:
        apply_memory_limits(fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), SPEC))
    assert "cannot write the limits journal" in str(raised.value)
    assert "'pod/ctr'" in str(raised.value)
    assert limit_files(ctr) == OLD


def test_a_read_back_that_differs_is_rolled_back(fake_root: FakeRoot, ctr: Path) -> None:
    def meddle(path: Path, value: str, proceed: Proceed) -> None:
        # Someone else writes memory.max right after this call did.
        proceed(value)
        if path.name == "memory.max" and value != "max":
            proceed(str(32 * MIB))

    fake_root.kernel.on("write", meddle)
    with pytest.raises(Aborted) as raised:
        apply_memory_limits(fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), SPEC))
    message = str(raised.value)
    assert f"memory.max of cgroup 'pod/ctr' reads back {32 * MIB} after writing {64 * MIB}" in (
        message
    )
    assert "restored memory.low to 0" in message
    assert limit_files(ctr) == OLD
    assert not journal_path(fake_root).exists()


def test_an_unexpected_error_rolls_back_from_the_journal(
    fake_root: FakeRoot,
    ctr: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("a bug after the writes")

    monkeypatch.setattr(limits, "_read_back", broken)
    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError):
        apply_memory_limits(fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), SPEC))
    assert limit_files(ctr) == OLD
    assert not journal_path(fake_root).exists()
    assert len(events(caplog, "limits_rolled_back")) == 1


# A crash inside the memory.max write, and the next start.


def kill_inside(fake_root: FakeRoot, file: str) -> None:
    """The kernel stores the new limit, then reclaims; the agent is killed while it does.
    Once: the next start (recover) writes through."""
    killed: list[Path] = []

    def kill(path: Path, value: str, proceed: Proceed) -> None:
        proceed(value)
        if path.name == file and not killed:
            killed.append(path)
            raise SimulatedKill

    fake_root.kernel.on("write", kill)


def test_a_kill_leaves_the_journal_and_the_next_start_rolls_back(
    fake_root: FakeRoot,
    ctr: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kill_inside(fake_root, "memory.max")
    with pytest.raises(SimulatedKill):
        apply_memory_limits(fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), SPEC))
    assert limit_files(ctr) == {**NEW, "memory.low": "0"}  # half applied
    assert limits_journal.load(fake_root.fs) == JOURNAL

    with caplog.at_level(logging.INFO):
        assert recover(fake_root.fs) == JOURNAL
    assert limit_files(ctr) == OLD
    assert not journal_path(fake_root).exists()
    (line,) = events(caplog, "limits_rolled_back")
    assert line["cgroup"] == "pod/ctr"
    assert line["restored"] == [
        {"file": "memory.max", "from": NEW["memory.max"], "to": "max"},
        {"file": "memory.swap.max", "from": NEW["memory.swap.max"], "to": "max"},
    ]
    assert line["old"] == OLD and line["new"] == NEW
    assert line["failed"] == []


def test_a_kill_while_creating_removes_what_was_made(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    fake_root.write("sys/fs/cgroup/cgroup.subtree_control", "cpu\n")
    kill_inside(fake_root, "memory.max")
    with pytest.raises(SimulatedKill):
        apply_memory_limits(fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), SPEC, create=True))
    mount = fake_root.root / "sys/fs/cgroup"
    assert (mount / "pod/ctr").is_dir()
    # What the kernel shows after the "+memory" write the fake tree keeps as text.
    fake_root.write("sys/fs/cgroup/cgroup.subtree_control", "cpu memory\n")
    recover(fake_root.fs)
    assert not (mount / "pod").exists()
    assert (mount / "cgroup.subtree_control").read_text() == "-memory"
    assert not journal_path(fake_root).exists()


@pytest.fixture
def kernel(fake_root: FakeRoot) -> FakeCgroupKernel:
    return FakeCgroupKernel(fake_root).install()


def test_a_journal_for_a_gone_cgroup_is_dropped(
    fake_root: FakeRoot, caplog: pytest.LogCaptureFixture
) -> None:
    limits_journal.save(fake_root.fs, JOURNAL)
    with caplog.at_level(logging.INFO):
        assert recover(fake_root.fs) == JOURNAL
    assert not journal_path(fake_root).exists()
    (line,) = events(caplog, "limits_journal_dropped")
    assert line["cgroup"] == "pod/ctr" and "no longer exists" in str(line["reason"])
    assert events(caplog, "limits_rolled_back") == []


def test_an_unreadable_journal_is_logged_and_moved_aside(
    fake_root: FakeRoot, ctr: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake_root.write("run/guestagent/limits-journal.json", '{"version": 9}')
    with caplog.at_level(logging.INFO):
        assert recover(fake_root.fs) is None
    assert not journal_path(fake_root).exists()
    assert list(journal_path(fake_root).parent.glob("limits-journal.json.corrupt-*"))
    (line,) = events(caplog, "state_file_corrupt")
    assert "version 9" in str(line["error"])
    assert limit_files(ctr) == OLD


def test_the_start_rolls_back_whatever_file_is_there(fake_root: FakeRoot) -> None:
    # The daemon loads ops/limits.py at start only when left_behind says so.
    assert not limits_journal.left_behind(fake_root.fs)
    limits_journal.save(fake_root.fs, JOURNAL)
    assert limits_journal.left_behind(fake_root.fs)
    fake_root.write("run/guestagent/limits-journal.json", '{"version": 9}')  # Not a journal.
    assert limits_journal.left_behind(fake_root.fs)
    assert recover(fake_root.fs) is None  # Moved aside.
    assert not limits_journal.left_behind(fake_root.fs)


def test_no_journal_no_work(fake_root: FakeRoot, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert recover(fake_root.fs) is None
    assert caplog.records == []


def test_a_failed_rollback_write_is_logged(
    fake_root: FakeRoot,
    ctr: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for name, value in NEW.items():
        (ctr / name).write_text(value)
    limits_journal.save(fake_root.fs, JOURNAL)

    for name in NEW:
        fake_root.kernel.fail("write", name, errno.EBUSY)
    with caplog.at_level(logging.INFO):
        recover(fake_root.fs)
    (line,) = events(caplog, "limits_rollback_failed")
    failed = line["failed"]
    assert isinstance(failed, list) and len(failed) == 3
    assert "EBUSY (Device or resource busy)" in failed[0]["error"]
    assert not journal_path(fake_root).exists()
