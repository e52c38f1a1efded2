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
