"""What the daemon's start loads: swap's machinery and the reclaimer only when an earlier agent
left them work, so a guest that never asks for them never holds their code; the contract's
code (protobuf, its descriptors, wire conversions, reports and operations) only with its
first call.
The daemon starts in a fresh interpreter over a fake root, as `guestagent serve` would, and
reports the modules.
Nor, whatever the calls, does it run protobuf's pure-Python implementation, or ipaddress
(a unix listener needs no loopback check).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path

from guestagent.agent.cli import PARSE_ONLY_MODULES
from guestagent.linux.statestore import RECLAIM_POLICIES, SWAPS, check_directory, state_file
from guestagent.ops.swap_area import MAPPING_PREFIX
from guestagent.ops.workingset.policy import ReclaimPolicy
from tests.fakes.root import FakeRoot
from tests.sitelessprobe import siteless_command

SWAP_MODULES = ("guestagent.ops.swap", "guestagent.linux.blockdev", "guestagent.linux.dm")
RECLAIMER_MODULES = ("guestagent.ops.workingset.reclaimer", "guestagent.ops.workingset.writer")
# protobuf too: the health service answers without it (agent/health.py).
CONTRACT_MODULES = (
    "google.protobuf",
    "guestagent.v1.agent_pb2",
    "guestagent.agent.rpc",
    "guestagent.agent.wire",
    "guestagent.ops.info",
    "guestagent.ops.limits",
    "guestagent.linux.watch",
)

PROBE = r"""
import asyncio, json, sys
sys.modules.setdefault("ssl", None)
from guestagent.load_on_use import LOADED_ON_USE, load_on_use
load_on_use(LOADED_ON_USE)
from pathlib import Path
from guestagent.agent.daemon import Agent, ServerConfig
from guestagent.linux.kernel import Kernel
from guestagent.transport.address import UnixAddress

root, socket, watched, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4:]

async def ask(methods):
    import grpc
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        for method in methods:
            try:
                await channel.unary_unary(f"/guestagent.v1.MemoryAgent/{method}")(b"", timeout=30)
            except grpc.aio.AioRpcError:
                pass  # A fake root has no /proc/swaps: the call was still served.

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
    await ask(calls)
    after_calls = [m for m in watched if m in sys.modules]
    await agent.stop()
    ran = [m for m in LOADED_ON_USE
           if m in sys.modules and type(sys.modules[m]).__name__ != "_LazyModule"]
    return {"loaded": loaded, "after_calls": after_calls, "ran": ran}

print(json.dumps(asyncio.run(start_and_stop())))
"""


def modules_after_start(fake_root: FakeRoot, tmp_path: Path, *then_calls: str) -> list[str]:
    """The watched modules loaded once the daemon has started; then_calls (methods with empty
    requests) are called before it stops."""
    loaded: list[str] = start_and_call(fake_root, tmp_path, *then_calls)["loaded"]
    return loaded


def start_and_call(fake_root: FakeRoot, tmp_path: Path, *then_calls: str) -> dict[str, list[str]]:
    """The probe's report: the watched modules loaded once the daemon has started and after
    the calls, and the modules entry() defers that had run by the time it stopped."""
    done = subprocess.run(
        siteless_command(
            PROBE,
            str(fake_root.root),
            str(tmp_path / "agent.sock"),
            json.dumps([*SWAP_MODULES, *RECLAIMER_MODULES, *CONTRACT_MODULES, *PARSE_ONLY_MODULES]),
            *then_calls,
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, list[str]] = json.loads(done.stdout)
    return report


def test_a_fresh_guest_loads_neither_swap_nor_the_reclaimer(
    fake_root: FakeRoot, tmp_path: Path
) -> None:
    # Nor the contract's code, nor argparse or gettext, which entry() dropped after the parse
    # (all watched in every case).
    assert modules_after_start(fake_root, tmp_path) == []


def test_the_first_call_loads_the_contracts_code(fake_root: FakeRoot, tmp_path: Path) -> None:
    report = start_and_call(fake_root, tmp_path, "GetAgentInfo")
    assert report["loaded"] == []  # Health said SERVING without it.
    assert set(CONTRACT_MODULES) <= set(report["after_calls"])


def test_swap_state_left_behind_is_checked_at_start(fake_root: FakeRoot, tmp_path: Path) -> None:
    check_directory(fake_root.fs)
    state_file(fake_root.fs, SWAPS).save({"/dev/vdb": {"discard": "pages"}})
    assert modules_after_start(fake_root, tmp_path) == list(SWAP_MODULES)
    assert modules_after_start(fake_root, tmp_path) == list(SWAP_MODULES)  # Still there.


def test_asking_about_swap_and_reclaim_leaves_nothing_for_the_next_start(
    fake_root: FakeRoot, tmp_path: Path
) -> None:
    asked = modules_after_start(fake_root, tmp_path, "ListSwaps", "GetReclaimStatus")
    assert asked == []  # Loaded only by the calls, after the snapshot.
    assert modules_after_start(fake_root, tmp_path) == []


def test_asking_the_reclaimers_status_before_any_policy_loads_no_reclaimer(
    fake_root: FakeRoot, tmp_path: Path
) -> None:
    """GetReclaimStatus with no policy answers as a new reclaimer would without building one
    (agent/daemon.py; tests/integration/test_reclaim_rpc.py has the answers)."""
    asked = start_and_call(fake_root, tmp_path, "GetReclaimStatus")["after_calls"]
    assert "guestagent.agent.rpc" in asked and set(RECLAIMER_MODULES).isdisjoint(asked)


def test_the_empty_state_older_agents_left_loads_its_part_once(
    fake_root: FakeRoot, tmp_path: Path
) -> None:
    check_directory(fake_root.fs)
    state_file(fake_root.fs, SWAPS).save({})
    state_file(fake_root.fs, RECLAIM_POLICIES).save({})
    assert set(modules_after_start(fake_root, tmp_path)) == {*SWAP_MODULES, *RECLAIMER_MODULES}
    assert modules_after_start(fake_root, tmp_path) == []


def test_a_mapping_of_ours_is_checked_at_start(fake_root: FakeRoot, tmp_path: Path) -> None:
    fake_root.write("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n")
    fake_root.add_mapping(MAPPING_PREFIX + "vdb", "dm-0", "253:0", "vdb")
    assert modules_after_start(fake_root, tmp_path) == list(SWAP_MODULES)


def test_someone_elses_mapping_is_not(fake_root: FakeRoot, tmp_path: Path) -> None:
    fake_root.add_mapping("vg0-root", "dm-0", "253:0", "vda")
    assert modules_after_start(fake_root, tmp_path) == []


def test_saved_reclaim_policies_are_reloaded_at_start(fake_root: FakeRoot, tmp_path: Path) -> None:
    check_directory(fake_root.fs)
    saved = {"pod": {"enabled": False, "policy": asdict(ReclaimPolicy())}}
    state_file(fake_root.fs, RECLAIM_POLICIES).save(saved)
    fake_root.add_cgroup("pod")
    loaded = modules_after_start(fake_root, tmp_path)
    assert set(RECLAIMER_MODULES) <= set(loaded) and "guestagent.ops.swap" not in loaded
    assert modules_after_start(fake_root, tmp_path) == loaded  # The policy is kept.


def test_no_call_runs_protobufs_pure_python_implementation_or_ipaddress(
    fake_root: FakeRoot, tmp_path: Path
) -> None:
    # Refusals included: an empty SetMemoryLimits is INVALID_ARGUMENT with google.rpc details.
    calls = ("GetMemoryInfo", "SetMemoryLimits", "ListSwaps", "GetReclaimStatus", "Compact")
    assert start_and_call(fake_root, tmp_path, *calls)["ran"] == []
