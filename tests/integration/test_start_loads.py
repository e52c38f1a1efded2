"""What the daemon's start loads: swap's machinery and the reclaimer only when an earlier agent
left them work, so a guest that never asks for them never holds their code. The daemon starts
in a fresh interpreter over a fake root, as `guestagent serve` would, and reports the modules.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from guestagent.ops.swap_area import MAPPING_PREFIX
from guestagent.statestore import RECLAIM_POLICIES, SWAPS, check_directory, state_file
from tests.fakes.root import FakeRoot

SWAP_MODULES = ("guestagent.ops.swap", "guestagent.linux.blockdev", "guestagent.linux.dm")
RECLAIMER_MODULES = ("guestagent.ops.workingset.reclaimer", "guestagent.ops.workingset.writer")

PROBE = r"""
import asyncio, json, sys
sys.modules.setdefault("ssl", None)
from pathlib import Path
from guestagent.agent.daemon import Agent, ServerConfig
from guestagent.linux.kernel import Kernel
from guestagent.transport.address import UnixAddress

root, socket, watched = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

async def start_and_stop():
    config = ServerConfig(
        listen=(UnixAddress(socket),),
        kernel=Kernel(Path(root), "sys/fs/cgroup"),
        online_memory=None,
        idle_aging_s=0,
        grace_seconds=0,
    )
    agent = Agent(config)
    await agent.start()
    loaded = [m for m in watched if m in sys.modules]
    await agent.stop()
    return loaded

print(json.dumps(asyncio.run(start_and_stop())))
"""


def modules_after_start(fake_root: FakeRoot, tmp_path: Path) -> list[str]:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE,
            str(fake_root.root),
            str(tmp_path / "agent.sock"),
            json.dumps([*SWAP_MODULES, *RECLAIMER_MODULES]),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def test_a_fresh_guest_loads_neither_swap_nor_the_reclaimer(
    fake_root: FakeRoot, tmp_path: Path
) -> None:
    assert modules_after_start(fake_root, tmp_path) == []


def test_swap_state_left_behind_is_checked_at_start(fake_root: FakeRoot, tmp_path: Path) -> None:
    check_directory(fake_root.fs)
    state_file(fake_root.fs, SWAPS).save({})
    assert modules_after_start(fake_root, tmp_path) == list(SWAP_MODULES)


def test_a_mapping_of_ours_is_checked_at_start(fake_root: FakeRoot, tmp_path: Path) -> None:
    fake_root.write("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n")
    fake_root.add_mapping(MAPPING_PREFIX + "vdb", "dm-0", "253:0", "vdb")
    assert modules_after_start(fake_root, tmp_path) == list(SWAP_MODULES)


def test_someone_elses_mapping_is_not(fake_root: FakeRoot, tmp_path: Path) -> None:
    fake_root.add_mapping("vg0-root", "dm-0", "253:0", "vda")
    assert modules_after_start(fake_root, tmp_path) == []


def test_saved_reclaim_policies_are_reloaded_at_start(fake_root: FakeRoot, tmp_path: Path) -> None:
    check_directory(fake_root.fs)
    state_file(fake_root.fs, RECLAIM_POLICIES).save({})
    loaded = modules_after_start(fake_root, tmp_path)
    assert set(RECLAIMER_MODULES) <= set(loaded) and "guestagent.ops.swap" not in loaded
