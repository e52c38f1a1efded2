from __future__ import annotations

import os
from pathlib import Path

import pytest

from guestagent.errors import FailedPrecondition
from guestagent.linux.statestore import MAX_BYTES, StateFile, StateFileError, state_file
from tests.fakes.root import FakeRoot


@pytest.fixture
def store(tmp_path: Path) -> StateFile:
    return StateFile(str(tmp_path / "run" / "guestagent" / "store.json"))


def test_save_then_load_round_trips_with_private_modes(store: StateFile) -> None:
    store.save({"a": [1, "two"]})
    assert store.load() == {"a": [1, "two"]}
    assert os.stat(store.path).st_mode & 0o777 == 0o600
    assert os.stat(Path(store.path).parent).st_mode & 0o777 == 0o700
    assert [p.name for p in Path(store.path).parent.iterdir()] == ["store.json"]


def test_nothing_saved_loads_as_none(store: StateFile) -> None:
    assert store.load() is None
    Path(store.path).parent.mkdir(parents=True)
    assert store.load() is None


def test_remove(store: StateFile) -> None:
    store.remove()  # Nothing there: not an error.
    store.save([])
    store.remove()
    assert store.load() is None


def test_an_empty_state_leaves_no_file(store: StateFile) -> None:
    # The file's existence is what loads swap or the reclaimer at start: `{}` must not be one.
    store.save_or_remove({"/dev/vdb": {"discard": "once"}})
    assert store.exists() and store.load() == {"/dev/vdb": {"discard": "once"}}
    store.save_or_remove({})
    assert not store.exists()
    store.save_or_remove({})  # Nothing there: not an error.
    assert not store.exists()


def test_a_temporary_file_left_by_a_kill_is_replaced(store: StateFile) -> None:
    store.save(1)
    leftover = Path(store.path).with_name(f".{Path(store.path).name}.tmp")
    leftover.write_text("half")
    store.save(2)
    assert store.load() == 2
    assert not leftover.exists()


def test_the_store_lives_under_run_guestagent(fake_root: FakeRoot) -> None:
    assert state_file(fake_root.fs, "x.json").path == str(fake_root.root / "run/guestagent/x.json")


@pytest.mark.parametrize(
    ("data", "words"),
    [
        pytest.param(b"{", "not valid JSON", id="truncated"),
        pytest.param(b"\xff\xfe{}", "not valid JSON", id="not UTF-8"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, "nests over 16 deep", id="too deep"),
        pytest.param(b" " * (MAX_BYTES + 1), f"over {MAX_BYTES} bytes", id="too large"),
    ],
)
def test_a_corrupt_file_is_a_clear_error(store: StateFile, data: bytes, words: str) -> None:
    store.save(None)
    Path(store.path).write_bytes(data)
    with pytest.raises(StateFileError, match=words) as raised:
        store.load()
    assert isinstance(raised.value, FailedPrecondition)
    assert str(store.path) in str(raised.value)


def test_a_symlinked_file_is_refused(store: StateFile, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    store.save(None)
    Path(store.path).unlink()
    Path(store.path).symlink_to(target)
    with pytest.raises(StateFileError, match=r"ELOOP.*symlink"):
        store.load()
    store.save({"b": 1})  # The rename replaces the link; the target is never written.
    assert target.read_text() == "{}"
    assert not Path(store.path).is_symlink()


def test_a_symlinked_directory_is_refused(store: StateFile, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    Path(store.path).parent.parent.mkdir()
    Path(store.path).parent.symlink_to(real)
    with pytest.raises(StateFileError):
        store.save({})
    with pytest.raises(StateFileError):
        store.load()
    assert list(real.iterdir()) == []


def test_a_directory_others_can_write_is_refused(store: StateFile) -> None:
    store.save({})
    os.chmod(Path(store.path).parent, 0o777)
    with pytest.raises(StateFileError, match="mode 777"):
        store.load()
    with pytest.raises(StateFileError, match="writable by no one else"):
        store.save({})


def test_a_directory_of_another_user_is_refused(store: StateFile) -> None:
    store.save({})
    os.chown(Path(store.path).parent, 65534, 65534)
    with pytest.raises(StateFileError, match="uid 65534"):
        store.load()


def test_a_file_others_can_write_is_refused(store: StateFile) -> None:
    store.save({})
    os.chmod(store.path, 0o666)
    with pytest.raises(StateFileError, match="mode 666"):
        store.load()


def test_a_fifo_is_refused_without_blocking(store: StateFile) -> None:
    Path(store.path).parent.mkdir(parents=True, mode=0o700)
    os.mkfifo(store.path, 0o600)
    with pytest.raises(StateFileError, match="not a regular file"):
        store.load()


def test_a_file_where_the_directory_should_be(store: StateFile) -> None:
    Path(store.path).parent.parent.mkdir()
    Path(store.path).parent.write_text("")
    with pytest.raises(StateFileError, match="ENOTDIR"):
        store.save({})
    with pytest.raises(StateFileError, match="ENOTDIR"):
        store.load()
