"""The `make test` runner's plan: every VM file in exactly one run, the shared guest booted once."""

import json
from pathlib import Path

from tests import run
from tests.run import NOT_VM, SHARED_GUEST, Item, Outcome, plan


def test_every_vm_file_is_in_exactly_one_run() -> None:
    files = sorted(run.VM_TESTS.glob("test_*.py"))
    items = plan(files, {})
    given = [p for item in items if item.name != NOT_VM for p in item.paths]
    assert sorted(given) == sorted(str(f.relative_to(run.ROOT)) for f in files)
    assert len(given) == len(set(given))


def test_files_without_their_own_guest_share_one_run() -> None:
    items = {item.name: item for item in plan(sorted(run.VM_TESTS.glob("test_*.py")), {})}
    shared = items[SHARED_GUEST].paths
    assert "tests/vm/test_boot.py" in shared
    assert "tests/vm/test_swap.py" not in shared  # it boots its own guest
    assert items["tests/vm/test_swap.py"].paths == ("tests/vm/test_swap.py",)
    assert "tests/vm/test_kata_fc.py" not in shared  # its own, made by module_guest()


def test_longest_first_and_unknown_before_all() -> None:
    files = [run.VM_TESTS / "test_swap.py", run.VM_TESTS / "test_limits.py"]
    durations = {NOT_VM: 100.0, "tests/vm/test_swap.py": 300.0}
    names = [item.name for item in plan(files, durations)]
    assert names == ["tests/vm/test_limits.py", "tests/vm/test_swap.py", NOT_VM]


def test_the_tally_is_pytests_last_line() -> None:
    output = "..F.\nguest pace per boot: 1.2x (0.2 s)\n1 failed, 3 passed, 2 skipped in 12.34s\n"
    outcome = Outcome(Item("x", ("x",)), 1, 12.3, output)
    assert outcome.counts == {"failed": 1, "passed": 3, "skipped": 2}
    errors = Outcome(Item("x", ("x",)), 2, 1.0, "1 error in 0.50s\n")
    assert errors.counts == {"error": 1}


def test_the_durations_file_names_only_runs_that_exist() -> None:
    known = {item.name for item in plan(sorted(run.VM_TESTS.glob("test_*.py")), {})}
    assert set(json.loads(Path(run.DURATIONS).read_text())["seconds"]) <= known
