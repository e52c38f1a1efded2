"""`make test`: every test, with the VM test files spread over lanes that run at once.

Each guest is one TCG vCPU, so two lanes on a 2-core host take about half the wall time of
one, and every VM test already holds with a host core taken by something else (`make
vm-stress`). Files that boot their own guest (a module-level `vm` fixture) run one pytest
each; the files sharing the session guest run together, so it still boots once. Items start
longest first, by the wall times in tests/vm/durations.json, so the lanes end together.

With --build, the guest images (and the node daemon's) build in one lane while the tests that
need neither a guest nor a built artifact run in the other (on a clean clone the guests' build
took two minutes, mostly on one core); the other runs start once it has succeeded, and are
reported not run if it failed.
The command must not write the source tree (`make test` builds the wheel, which regenerates
the protobuf modules in it, before).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VM_TESTS = ROOT / "tests" / "vm"
DURATIONS = VM_TESTS / "durations.json"
NOT_VM = "unit, integration, hostile"
SHARED_GUEST = "the shared guest"
BUILD = "the guest images"
# The integration tests of the built bundle and of the node daemon's image: they need the
# build, as the VM runs do.
BUNDLE_TESTS = "tests/integration/test_bundle.py"
NODE_IMAGE_TESTS = "tests/integration/test_node_image.py"
BUILT_TESTS = (BUNDLE_TESTS, NODE_IMAGE_TESTS)
# A module-level `vm` fixture: written out, or made by tests/vm/guest.py module_guest().
OWN_GUEST = re.compile(r"^(def vm\(|vm = module_guest\()", re.MULTILINE)
COUNT = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?)")
TALLY = re.compile(r"\d+ (passed|failed|skipped|errors?|xfailed|xpassed|deselected).* in [\d.]+s")


@dataclass(frozen=True)
class Item:
    """One pytest run: a name for the log and the paths it is given."""

    name: str
    paths: tuple[str, ...]


@dataclass(frozen=True)
class Outcome:
    item: Item
    returncode: int
    seconds: float
    output: str

    @property
    def counts(self) -> dict[str, int]:
        """pytest's final tally, e.g. {"passed": 12, "skipped": 1}."""
        lines = [line for line in self.output.splitlines() if TALLY.search(line)]
        found = COUNT.findall(lines[-1]) if lines else []
        return {kind.rstrip("s") if kind.startswith("error") else kind: int(n) for n, kind in found}


def plan(vm_files: Sequence[Path], durations: dict[str, float]) -> list[Item]:
    """The runs, longest expected first; unknown ones first of all, as they may be long."""
    relative = [str(path.relative_to(ROOT)) for path in sorted(vm_files)]
    shared = tuple(p for p in relative if not OWN_GUEST.search((ROOT / p).read_text()))
    items = [
        Item(NOT_VM, ("tests", "--ignore=tests/vm", *(f"--ignore={t}" for t in BUILT_TESTS))),
        *(Item(t, (t,)) for t in BUILT_TESTS),
    ]
    if shared:
        items.append(Item(SHARED_GUEST, shared))
    items += [Item(p, (p,)) for p in relative if p not in shared]
    return sorted(items, key=lambda item: -durations.get(item.name, float("inf")))


def beside_the_build(items: list[Item]) -> list[Item]:
    """The runs in the order they start while the images build in a lane of their own: the
    one that needs no guest first, beside the build, then the VM runs as planned."""
    return [i for i in items if i.name == NOT_VM] + [i for i in items if i.name != NOT_VM]


def captured(item: Item, command: Sequence[str]) -> Outcome:
    """Run a command in the repository, its output and its time kept as the item's."""
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    return Outcome(item, done.returncode, time.monotonic() - started, done.stdout)


def run(item: Item, basetemp: Path, extra: Sequence[str]) -> Outcome:
    """One pytest, in its own temporary directory (short: tests bind unix sockets in it)."""
    command = [sys.executable, "-m", "pytest", "-q", f"--basetemp={basetemp}"]
    return captured(item, [*command, *extra, *item.paths])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, default=int(os.environ.get("TEST_LANES", "2")))
    parser.add_argument("--record", action="store_true", help=f"write the times to {DURATIONS}")
    parser.add_argument("--build", help="the command that builds the guest images, run first")
    parser.add_argument("pytest_args", nargs="*", help="passed to every pytest run")
    args = parser.parse_args(argv)
    durations = json.loads(DURATIONS.read_text())["seconds"] if DURATIONS.exists() else {}
    items = plan(list(VM_TESTS.glob("test_*.py")), durations)
    if args.build:
        items = beside_the_build(items)
    printing = threading.Lock()
    outcomes: list[Outcome] = []
    built = threading.Event()
    build_failed = False

    def show(outcome: Outcome) -> None:
        with printing:
            verdict = "ok" if outcome.returncode == 0 else f"FAILED (exit {outcome.returncode})"
            print(f"=== {outcome.item.name}: {verdict} in {outcome.seconds:.0f} s", flush=True)
            print(outcome.output.rstrip(), flush=True)

    def build_images(command: str) -> None:
        nonlocal build_failed
        build_failed = True  # Until it has built, so the VM runs never start on a failed one.
        try:
            try:
                outcome = captured(Item(BUILD, ()), shlex.split(command))
            except OSError as error:  # No such command, say.
                outcome = Outcome(Item(BUILD, ()), 1, 0.0, f"{command}: {error}")
            build_failed = outcome.returncode != 0
            show(outcome)
        finally:
            built.set()

    def report(item: Item, basetemp: Path) -> None:
        needs_build = bool(args.build) and item.name != NOT_VM
        if needs_build:
            built.wait()
        if needs_build and build_failed:
            outcome = Outcome(item, 1, 0.0, f"not run: {BUILD} did not build")
        else:
            outcome = run(item, basetemp, args.pytest_args)
        show(outcome)
        outcomes.append(outcome)

    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="gat-") as basetemp,
        ThreadPoolExecutor(max_workers=max(1, args.lanes)) as pool,
    ):
        if args.build:
            pool.submit(build_images, args.build)
        for number, item in enumerate(items):
            pool.submit(report, item, Path(basetemp) / str(number))
    wall = time.monotonic() - started

    totals: dict[str, int] = {}
    print(f"=== {len(outcomes)} runs in {args.lanes} lanes, {wall / 60:.1f} min wall:")
    for outcome in sorted(outcomes, key=lambda o: -o.seconds):
        for kind, n in outcome.counts.items():
            totals[kind] = totals.get(kind, 0) + n
        verdict = "ok" if outcome.returncode == 0 else "FAILED"
        print(f"  {outcome.seconds:7.0f} s  {verdict:6}  {outcome.item.name}")
    print("=== " + ", ".join(f"{n} {kind}" for kind, n in sorted(totals.items())))
    if args.record:
        seconds = {o.item.name: round(o.seconds) for o in outcomes}
        DURATIONS.write_text(json.dumps({"seconds": seconds}, indent=2, sort_keys=True) + "\n")
    failed = [o for o in outcomes if o.returncode != 0]
    return 1 if failed or build_failed or len(outcomes) != len(items) else 0


if __name__ == "__main__":
    sys.exit(main())
