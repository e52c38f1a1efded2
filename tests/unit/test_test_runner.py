"""The `make test` runner: every VM file in exactly one run, the shared guest booted once, and
the images built beside the runs that need no guest."""

import contextlib
import io
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests import run
from tests.run import (
    BUILT_TESTS,
    BUNDLE_TESTS,
    NODE_IMAGE_TESTS,
    NOT_VM,
    SHARED_GUEST,
    Item,
    Outcome,
    beside_the_build,
    plan,
)


def test_every_vm_file_is_in_exactly_one_run() -> None:
    files = sorted(run.VM_TESTS.glob("test_*.py"))
    items = plan(files, {})
    given = [p for item in items if item.name not in (NOT_VM, *BUILT_TESTS) for p in item.paths]
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
    durations = {
        NOT_VM: 100.0,
        "tests/vm/test_swap.py": 300.0,
        BUNDLE_TESTS: 50.0,
        NODE_IMAGE_TESTS: 20.0,
    }
    names = [item.name for item in plan(files, durations)]
    assert names == [
        "tests/vm/test_limits.py",
        "tests/vm/test_swap.py",
        NOT_VM,
        BUNDLE_TESTS,
        NODE_IMAGE_TESTS,
    ]


def test_the_built_artifacts_tests_run_apart_from_the_rest_which_need_no_build() -> None:
    items = {item.name: item for item in plan([], {})}
    for tests in (BUNDLE_TESTS, NODE_IMAGE_TESTS):
        assert items[tests].paths == (tests,)
        assert f"--ignore={tests}" in items[NOT_VM].paths
    assert "--ignore=tests/vm" in items[NOT_VM].paths


def test_beside_the_build_the_run_needing_no_build_starts_first() -> None:
    items = plan([run.VM_TESTS / "test_swap.py"], {NOT_VM: 10.0, "tests/vm/test_swap.py": 300.0})
    ordered = beside_the_build(items)
    assert ordered[0].name == NOT_VM
    assert ordered[1:] == [i for i in items if i.name != NOT_VM]


def scheduled(monkeypatch: pytest.MonkeyPatch, build: str) -> tuple[int, list[str], str]:
    """main() with --build, each pytest run stood in for by a record of its name: the exit
    status, the runs that ran, and the log."""
    ran: list[str] = []

    def fake_run(item: Item, basetemp: Path, extra: Sequence[str]) -> Outcome:
        ran.append(item.name)
        return Outcome(item, 0, 0.0, "1 passed in 0.01s\n")

    monkeypatch.setattr(run, "run", fake_run)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = run.main(["--lanes", "2", "--build", build])
    return status, ran, out.getvalue()


def test_a_failed_build_runs_only_what_needs_no_build_and_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    status, ran, log = scheduled(monkeypatch, "sh -c 'echo no kernel; exit 3'")
    assert status == 1
    assert ran == [NOT_VM]
    assert "=== the guest images: FAILED (exit 3)" in log and "no kernel" in log
    assert f"=== {BUNDLE_TESTS}: FAILED (exit 1)" in log
    assert "not run: the guest images did not build" in log


def test_a_build_that_cannot_start_fails_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    status, ran, log = scheduled(monkeypatch, "/nonexistent/make image")
    assert (status, ran) == (1, [NOT_VM])
    assert "No such file" in log


def test_after_a_build_every_run_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    status, ran, log = scheduled(monkeypatch, "true")
    assert status == 0
    assert sorted(ran) == sorted(i.name for i in plan(list(run.VM_TESTS.glob("test_*.py")), {}))
    assert log.index("=== the guest images: ok") < log.index(f"=== {SHARED_GUEST}: ok")


def test_the_tally_is_pytests_last_line() -> None:
    output = "..F.\nguest pace per boot: 1.2x (0.2 s)\n1 failed, 3 passed, 2 skipped in 12.34s\n"
    outcome = Outcome(Item("x", ("x",)), 1, 12.3, output)
    assert outcome.counts == {"failed": 1, "passed": 3, "skipped": 2}
    errors = Outcome(Item("x", ("x",)), 2, 1.0, "1 error in 0.50s\n")
    assert errors.counts == {"error": 1}


def test_the_durations_file_names_only_runs_that_exist() -> None:
    known = {item.name for item in plan(sorted(run.VM_TESTS.glob("test_*.py")), {})}
    assert set(json.loads(Path(run.DURATIONS).read_text())["seconds"]) <= known
