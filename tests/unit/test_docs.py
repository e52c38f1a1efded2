"""The docs against the tree: every repository path they name exists, the README's `serve`
synopsis names every option `guestagent serve` takes, and kata-extension.md shows the
components.toml the build writes."""

from __future__ import annotations

import argparse
import re
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
    assert named == tree_modules()


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
