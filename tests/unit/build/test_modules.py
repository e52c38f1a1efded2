"""The import closure: every statement counts, scripts' main blocks and pruned names do not."""

from __future__ import annotations

from pathlib import Path

from guestagent.build.modules import closure

SUFFIXES = (".cpython-311-x86_64-linux-gnu.so", ".abi3.so", ".so")


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_closure_follows_every_kind_of_import(tmp_path: Path) -> None:
    lib = write(
        tmp_path / "lib",
        {
            "app/__init__.py": "",
            "app/main.py": "from . import helpers\nfrom .sub import deep\n"
            "def later():\n    import lazy\n",
            "app/helpers.py": "import json_like\n",
            "app/sub/__init__.py": "",
            "app/sub/deep.py": "from ..helpers import thing\nimport nsp.inner\n",
            "json_like.py": "if __name__ == '__main__':\n    import selftest\n",
            "lazy.py": "import _speedups\nimport pruned.child\n",
            "_speedups.cpython-311-x86_64-linux-gnu.so": "",
            "nsp/inner.py": "import sys\n",
            "selftest.py": "",
            "pruned/__init__.py": "",
            "pruned/child.py": "",
        },
    )
    found, missing = closure(
        ["app.main"], [lib], SUFFIXES, frozenset({"sys"}), frozenset({"pruned"})
    )
    assert set(found) == {
        "app",
        "app.main",
        "app.helpers",
        "app.sub",
        "app.sub.deep",
        "json_like",
        "lazy",
        "_speedups",
        "nsp",
        "nsp.inner",
    }
    assert found["_speedups"].path.name.endswith(".so")
    assert found["nsp"].path.is_dir()  # a namespace package
    assert "selftest" not in found  # only a script's main block imports it
    assert "app.helpers.thing" in missing  # `from x import function`: not a module


def test_first_entry_of_the_search_path_wins(tmp_path: Path) -> None:
    first = write(tmp_path / "a", {"mod.py": ""})
    second = write(tmp_path / "b", {"mod.py": "import other\n", "other.py": ""})
    found, _ = closure(["mod"], [first, second], SUFFIXES, frozenset())
    assert found["mod"].path == first / "mod.py"
    assert "other" not in found
