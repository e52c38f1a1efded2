"""A Go client generated from protos/ alone (tests/go), against the agent in a real guest:
what a runtime in Go sees of the contract. Built with Debian's Go packages only."""

from __future__ import annotations

import queue
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from guestagent.host.client import AgentClient
from guestagent.ops.agent_info import CONTRACT_REVISION
from guestagent.vm.qemu import GuestVM
from tests.vm.pace import Pace

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
CGROUP = "goclient/ctr"


@pytest.fixture(scope="module")
def go_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = [
        t for t in ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc") if not shutil.which(t)
    ]
    assert missing == [], "make setup installs them (image/install-host-deps.sh)"
    work = tmp_path_factory.mktemp("go")
    binary = work / "guestagent-client"
    subprocess.run([REPO / "tests/go/build.sh", binary, work / "build"], check=True)
    return binary


def lines_of(process: subprocess.Popen[str], into: queue.Queue[str | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        into.put(line.rstrip("\n"))
    into.put(None)


def test_a_go_client_reads_reasons_and_keeps_its_stream_across_a_container_exit(
    vm: GuestVM, agent: AgentClient, pace: Pace, go_client: Path
) -> None:
    agent.wait_ready(pace.scale(60))
    target = vm.agent_target.removeprefix("tcp://")
    process = subprocess.Popen(
        [go_client, target, CGROUP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lines_of, args=(process, lines), daemon=True).start()
    output: list[str] = []
    try:
        while (line := lines.get(timeout=pace.scale(300))) is not None:
            output.append(line)
            if line == f"REMOVE {CGROUP}":
                vm.exec(["rmdir", f"/sys/fs/cgroup/{CGROUP}"])  # As a container exit does.
                assert process.stdin is not None
                process.stdin.write("removed\n")
                process.stdin.flush()
        assert process.wait(timeout=pace.scale(60)) == 0, "\n".join(output)
    finally:
        process.kill()
        vm.exec(f"rmdir /sys/fs/cgroup/{CGROUP} /sys/fs/cgroup/{CGROUP.split('/')[0]}; true")
    print("\n".join(output))  # The Go client's own account, for the log.
    text = "\n".join(output)
    assert output[-1] == "OK", text
    assert f"contract_revision={CONTRACT_REVISION}" in text and "psi" in text
    assert "refused NotFound reason=CGROUP_NOT_FOUND" in text
    assert "refused InvalidArgument reason=SWAP_TOTAL_BELOW_LIMIT fields=[memory.swap]" in text
    assert f"removed_cgroups=[{CGROUP}], the stream goes on" in text
    assert f"{CGROUP} is back, max={64 << 20}" in text
