"""The agent's own tools come first; PATH only where its runtime has none."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from guestagent.linux import tools


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/true\n")
    path.chmod(0o755)
    return path


def test_the_runtimes_own_copy_wins_over_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = executable(tmp_path / "runtime/sbin/mkswap")
    executable(tmp_path / "guest/bin/mkswap")
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "runtime"))
    monkeypatch.setenv("PATH", str(tmp_path / "guest/bin"))
    assert tools.tool_path("mkswap") == str(own)


def test_path_serves_when_the_runtime_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    guest = executable(tmp_path / "guest/bin/blkid")
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "runtime"))
    monkeypatch.setenv("PATH", str(tmp_path / "guest/bin"))
    assert tools.tool_path("blkid") == str(guest)


def test_a_missing_tool_is_named_with_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "runtime"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(
        tools.ToolMissing, match=f"mkswap is not installed.*{tmp_path}/runtime/sbin"
    ):
        tools.tool_path("mkswap")
    assert tools.blkid_signatures("/dev/null") == []  # no blkid: no second opinion


def test_a_non_executable_file_is_not_a_tool(tmp_path: Path) -> None:
    (tmp_path / "sbin").mkdir()
    (tmp_path / "sbin/mkswap").write_text("not executable")
    os.chmod(tmp_path / "sbin/mkswap", 0o644)
    assert tools.own_tool("mkswap", str(tmp_path)) is None
