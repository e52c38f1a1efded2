"""The private directory a vsock or hybrid vsock target's relay listens in: made as
tempfile.mkdtemp makes one, and gone with the target."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from guestagent.host.client import RELAY_SOCKET, AgentTarget, private_directory


def test_a_private_directory_is_new_and_only_its_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    made = {private_directory() for _ in range(20)}
    assert len(made) == 20
    for path in made:
        assert Path(path).parent == tmp_path and Path(path).name.startswith("guestctl-")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


def test_a_relays_directory_goes_with_its_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with AgentTarget(f"hvsock://{tmp_path}/vm.sock:1024", 1.0) as target:
        (directory,) = [p for p in tmp_path.iterdir() if p.name.startswith("guestctl-")]
        assert target.grpc_target == f"unix://{directory / RELAY_SOCKET}"
        assert (directory / RELAY_SOCKET).is_socket()
    assert not directory.exists()
