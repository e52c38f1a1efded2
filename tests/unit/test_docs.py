"""The docs against the tree: every repository path they name exists, the README's `serve`
synopsis names every option `guestagent serve` takes, kata-extension.md shows the
components.toml the build writes, and measurements.md stays a set of current tables, each row
dated with a commit that exists."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest

from guestagent.agent import cli
from guestagent.build.extension import agent_process, components_toml

ROOT = Path(__file__).parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
# A path into the tree: from a top-level folder, ending in a name character.
PATH = re.compile(r"(?<![\w/.-])((?:guestagent|tests|docs|image|protos)/[\w./{},-]*\w)")
# What a build or a run writes (ignored by git), and other projects' paths quoted as theirs.
NOT_IN_THE_TREE = ("tests/vm/results/", "tests/bench/results/", "image/build", "docs/design/")


def named_paths(text: str) -> list[str]:
    return [
        path
        for path in PATH.findall(text)
        if not path.startswith(NOT_IN_THE_TREE) and not re.search(r"[{}<*]|NAME", path)
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    missing = [path for path in named_paths(doc.read_text()) if not (ROOT / path).exists()]
    assert missing == []


def test_the_path_finder_finds_a_stale_path() -> None:
    text = "relays (`guestagent/relay.py`), see tests/vm/results/swap.json and image/build/x"
    assert named_paths(text) == ["guestagent/relay.py"]


def _serve_options() -> list[str]:
    (commands,) = [
        action
        for action in cli.build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    serve = commands.choices["serve"]
    return [action.option_strings[-1] for action in serve._actions if action.option_strings][1:]


def test_the_readme_serve_synopsis_names_every_option() -> None:
    readme = (ROOT / "README.md").read_text()
    synopsis = readme[readme.index("```\nguestagent serve ") :].split("```")[1]
    missing = [option for option in _serve_options() if option not in synopsis]
    assert missing == []


def test_kata_extension_md_shows_the_components_toml_the_build_writes() -> None:
    """It once said there was no `env`; the build writes LC_ALL."""
    doc = (ROOT / "docs/kata-extension.md").read_text()
    written = components_toml([agent_process()]).splitlines()[1:]  # past the comment
    shown = "\n".join(f"      {line}" if line else "" for line in written)
    assert shown + "\n\n" in doc


def readme_map(readme: str) -> dict[str, set[str]]:
    """The README's map of the tree: each folder it names, from the root, with the modules
    listed on its lines (a folder's line, and the lines under it that start with a module)."""
    block = readme[readme.index("## Map of the tree") :].split("```")[1]
    folders: dict[str, set[str]] = {}
    open_folders: list[tuple[int, str]] = []  # (indent, path), outermost first
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        first = line.split()[0]
        if first.endswith("/"):
            while open_folders and open_folders[-1][0] >= indent:
                open_folders.pop()
            parent = open_folders[-1][1] if open_folders else ""
            open_folders.append((indent, parent + first))
        folder = open_folders[-1][1]
        folders.setdefault(folder, set()).update(re.findall(r"[\w]+\.py\b", line))
    return folders


def tree_modules() -> dict[str, set[str]]:
    """Every folder of guestagent/ with its modules (packages' __init__.py and the generated
    protobuf modules aside)."""
    folders: dict[str, set[str]] = {}
    for path in sorted((ROOT / "guestagent").rglob("*.py")):
        if path.name == "__init__.py" or "_pb2" in path.name:
            folders.setdefault(f"{path.parent.relative_to(ROOT)}/", set())
            continue
        folders.setdefault(f"{path.parent.relative_to(ROOT)}/", set()).add(path.name)
    return folders


def test_the_readme_map_names_every_module_and_no_other() -> None:
    folders = readme_map((ROOT / "README.md").read_text())
    named = {folder: names for folder, names in folders.items() if folder.startswith("guestagent/")}
    tree = tree_modules()
    missing = sorted(
        f"{folder}{name}" for folder in tree for name in tree[folder] - named.get(folder, set())
    )
    stale = sorted(
        f"{folder}{name}" for folder in named for name in named[folder] - tree.get(folder, set())
    )
    assert (missing, stale) == ([], [])
    assert set(named) == set(tree)


def test_the_map_reader_sees_a_missing_and_a_stale_module() -> None:
    text = (
        "## Map of the tree\n```\nguestagent/     a.py: x\n  linux/        one.py\n"
        "                two.py gone.py\n    sub/        three.py\n  ops/          four.py\n```\n"
    )
    assert readme_map(text) == {
        "guestagent/": {"a.py"},
        "guestagent/linux/": {"one.py", "two.py", "gone.py"},
        "guestagent/linux/sub/": {"three.py"},
        "guestagent/ops/": {"four.py"},
    }


# A run cell: the day of the run and the commit of the tree it measured (or that recorded it).
RUN_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def undated_rows(text: str) -> list[str]:
    """Every table row of a measurements doc whose table has no last `run` column, or whose run
    cell lacks a date or a commit; the separator rows aside."""
    bad: list[str] = []
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        if header is None:
            header = cells(line)
            continue
        if set(line) <= set("|- "):
            continue
        run = cells(line)[-1]
        if header[-1] != "run" or not RUN_DATE.search(run) or not COMMIT.search(run):
            bad.append(line)
    return bad


# Elsewhere (the history, the prose) a commit is told from a figure by a letter in it.
LETTERED_COMMIT = re.compile(r"\b(?=[0-9]*[a-f])[0-9a-f]{7,12}\b")


def named_commits(text: str) -> set[str]:
    """Every commit in a run cell, and every lettered hash anywhere."""
    in_runs = {
        commit
        for line in text.splitlines()
        if line.startswith("|")
        for commit in COMMIT.findall(cells(line)[-1])
    }
    return in_runs | set(LETTERED_COMMIT.findall(text))


def test_every_measurement_row_is_dated_with_a_commit() -> None:
    assert undated_rows((ROOT / "docs/measurements.md").read_text()) == []


def test_commits_are_told_from_figures() -> None:
    text = (
        "| a | 33554432 B, sha256 0d0a4f76aa957fce05768f | 2026-12-07, 1423560 |\n"
        "- a cut (c21142a): 1040187392 B\n"
    )
    assert named_commits(text) == {"1423560", "c21142a"}


def test_the_row_check_finds_an_undated_row_and_a_table_without_runs() -> None:
    text = (
        "| figure | value | run |\n| --- | --- | --- |\n"
        "| dated | 1 s | 2026-12-07, 387ec82 |\n| no commit | 2 s | by 2026-12-03 |\n\n"
        "| figure | value |\n| --- | --- |\n| no run column | 3 s, 2026-12-07, 387ec82 |\n"
    )
    assert undated_rows(text) == [
        "| no commit | 2 s | by 2026-12-03 |",
        "| no run column | 3 s, 2026-12-07, 387ec82 |",
    ]


def test_every_commit_a_measurement_names_exists() -> None:
    """A shallow clone or a tree outside git cannot say; everywhere else a hash that names no
    commit is a typo or a rewritten history."""
    git = ["git", "-C", str(ROOT)]
    shallow = subprocess.run(
        [*git, "rev-parse", "--is-shallow-repository"], capture_output=True, text=True
    )
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("not a full git checkout")
    commits = sorted(named_commits((ROOT / "docs/measurements.md").read_text()))
    found = subprocess.run(
        [*git, "cat-file", "--batch-check"],
        input="".join(f"{commit}^{{commit}}\n" for commit in commits),
        capture_output=True,
        text=True,
        check=True,
    )
    # "<sha> commit <size>" for a commit; "<name> missing" or "<name> ambiguous" otherwise.
    missing = [
        line.split()[0].removesuffix("^{commit}")
        for line in found.stdout.splitlines()
        if line.split()[1] != "commit"
    ]
    assert commits and missing == []


def anchor(heading: str) -> str:
    """A Markdown heading's anchor, as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def broken_anchors(docs: list[Path]) -> list[str]:
    anchors = {
        doc.name: {anchor(h) for h in re.findall(r"^#+ (.*)$", doc.read_text(), re.MULTILINE)}
        for doc in docs
    }
    broken = []
    for doc in docs:
        for target, fragment in re.findall(
            r"\]\((?:docs/)?([\w-]*\.md)?#([\w-]+)\)", doc.read_text()
        ):
            name = target or doc.name
            if name in anchors and fragment not in anchors[name]:
                broken.append(f"{doc.name}: {name}#{fragment}")
    return broken


def test_every_link_into_a_doc_names_a_heading_it_has() -> None:
    assert broken_anchors(DOCS) == []


def test_the_anchor_check_sees_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(
        "## Giving memory back\n[x](b.md#gone) [y](#giving-memory-back)\n"
    )
    (tmp_path / "b.md").write_text("# The node's daemon (issue 55)\n[z](a.md#giving-memory-back)\n")
    docs = [tmp_path / "a.md", tmp_path / "b.md"]
    assert broken_anchors(docs) == ["a.md: b.md#gone"]
    assert anchor("The node's daemon (issue 55)") == "the-nodes-daemon-issue-55"


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_no_merge_conflict_is_left_in_a_doc(doc: Path) -> None:
    markers = re.findall(r"^(?:<{7} |={7}$|>{7} ).*", doc.read_text(), re.MULTILINE)
    assert markers == []
