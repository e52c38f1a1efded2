"""A client built from the previous contract (agent.proto at 98f2f31, before issues 23 and 24
added fields) against today's agent: every field it knows comes back as today's client reads
it, and a request it sends (without the new fields) is served as before.

The old client is generated here, at test time, into a temp dir, and runs in a process of its
own: its agent.proto would clash with today's in one process's descriptor pool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.json_format import MessageToDict

from guestagent.host.client import AgentClient
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.agentproc import AgentProcess
from tests.fakes.root import FakeRoot

PREVIOUS = "98f2f31"
PROTO = "protos/guestagent/v1/agent.proto"
REPO = Path(__file__).resolve().parents[2]
SWAPS = (
    "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
    "/dev/vdb                                partition\t1048572\t\t2048\t\t-2\n"
)

# Runs with only the old generated code ahead of the installed package on sys.path.
OLD_CLIENT = """
import json, sys
import grpc
from google.protobuf.json_format import MessageToDict
from guestagent.v1 import agent_pb2 as pb, agent_pb2_grpc as pb_grpc
assert pb.__file__.startswith(sys.argv[2]), pb.__file__
def d(message):
    return MessageToDict(message, preserving_proto_field_name=True)
stub = pb_grpc.MemoryAgentStub(grpc.insecure_channel(sys.argv[1]))
out = {"info": d(stub.GetMemoryInfo(pb.GetMemoryInfoRequest(cgroups=["pod/ctr"]), timeout=30))}
stream = stub.WatchMemory(pb.WatchMemoryRequest(cgroups=["pod/ctr"], interval_ms=1000))
out["watch"] = d(next(stream))
stream.cancel()
out["swaps"] = d(stub.ListSwaps(pb.ListSwapsRequest(), timeout=30))
try:
    stub.EnableSwap(
        pb.EnableSwapRequest(device=pb.DeviceSelector(serial="nosuch"), label="old"), timeout=30
    )
    out["enable"] = "OK"
except grpc.RpcError as e:
    out["enable"] = e.code().name
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def old_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous proto's generated Python, as a package tree in a temp dir."""
    out = tmp_path_factory.mktemp("old-client")
    proto = out / "protos" / "guestagent" / "v1" / "agent.proto"
    proto.parent.mkdir(parents=True)
    shown = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{PREVIOUS}:{PROTO}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if shown.returncode != 0:
        pytest.skip(f"no {PREVIOUS} in this clone (shallow?): {shown.stderr.strip()}")
    proto.write_text(shown.stdout)
    assert "giveback" not in shown.stdout  # Truly the contract before the new fields.
    protoc = [sys.executable, "-m", "grpc_tools.protoc", f"-I{out / 'protos'}"]
    subprocess.run(
        [*protoc, f"--python_out={out}", f"--grpc_python_out={out}", str(proto)], check=True
    )
    # Regular packages, so they win over the installed guestagent on the path.
    for package in (out / "guestagent", out / "guestagent" / "v1"):
        (package / "__init__.py").touch()
    return out


def without_times(value: Any) -> Any:
    """A report as a dict, less what changes between two calls."""
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items() if not k.endswith("_unix_ns")}
    if isinstance(value, list):
        return [without_times(v) for v in value]
    return value


def known_to(old: Any, new: Any) -> Any:
    """new cut down to the keys old has: what the old client could read of it."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {k: known_to(old[k], new[k]) for k in old if k in new}
    if isinstance(old, list) and isinstance(new, list):
        return [known_to(o, n) for o, n in zip(old, new, strict=False)]
    return new


def test_the_previous_contracts_client_reads_todays_agent(
    agent: AgentProcess, fake_root: FakeRoot, old_client: Path
) -> None:
    fake_root.write("proc/swaps", SWAPS)
    run = subprocess.run(
        [sys.executable, "-c", OLD_CLIENT, agent.unix_target, str(old_client)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(old_client)},
        cwd=old_client,  # python -c puts the working directory first on the path.
        check=False,
    )
    assert run.returncode == 0, run.stderr
    old = json.loads(run.stdout)

    def d(message: Any) -> Any:
        return MessageToDict(message, preserving_proto_field_name=True)

    with AgentClient(agent.unix_target) as client:
        info = client.info(["pod/ctr"])
        swaps = client.list_swaps()
        with pytest.raises(grpc.RpcError) as new_enable:
            client.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="nosuch")))
    new_info = without_times(d(info))
    old_info = without_times(old["info"])
    # The fields the old client knows, with today's values, and nothing of them missing.
    assert old_info == known_to(old_info, new_info)
    assert set(new_info) - set(old_info) <= {"idle", "giveback", "confidential"}
    assert int(old_info["system"]["mem_total_bytes"]) == info.system.mem_total_bytes > 0
    assert old_info["cgroups"][0]["path"] == "pod/ctr"
    assert old["watch"]["cgroups"][0]["path"] == "pod/ctr"
    assert without_times(old["watch"])["system"] == old_info["system"]
    assert old["swaps"] == known_to(old["swaps"], d(pb.ListSwapsResponse(areas=swaps)))
    assert old["swaps"]["areas"][0]["device"] == "/dev/vdb"
    # Without the new encryption field, EnableSwap fails the same way for both clients.
    assert old["enable"] == new_enable.value.code().name
