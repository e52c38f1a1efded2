"""The footprint bench's contract server (tests/bench/contract_server.py) serves what the bench
asks of the agent: health's SERVING, an empty reply from each method of the contract and
WatchMemory's stream, one message a second."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from guestagent.v1 import agent_pb2
from tests.bench.footprint import AGENT_CALLS, HEALTH_CHECK, WATCH

SERVER = Path(__file__).parents[1] / "bench" / "contract_server.py"


@pytest.fixture
def contract_server(tmp_path: Path) -> Iterator[str]:
    target = f"unix://{tmp_path}/contract.sock"
    server = subprocess.Popen([sys.executable, "-OO", str(SERVER), target])
    try:
        yield target
    finally:
        server.terminate()
        server.wait(10)


def test_contract_server_answers_the_benchs_calls_and_stream(contract_server: str) -> None:
    with grpc.insecure_channel(contract_server) as channel:
        raw: Any = channel.unary_unary
        check, request, serving = HEALTH_CHECK
        ready = raw(check)(bytes.fromhex(request), timeout=30, wait_for_ready=True)
        assert ready == bytes.fromhex(serving)
        replies = {method: raw(method)(bytes.fromhex(r), timeout=10) for method, r in AGENT_CALLS}
        empty_but_health = {m: ready if m == check else b"" for m, _ in AGENT_CALLS}
        assert replies == empty_but_health
        # Every method of the contract, not only the bench's: the reply decodes as its type.
        service = agent_pb2.DESCRIPTOR.services_by_name["MemoryAgent"]
        for rpc in service.methods:
            if rpc.server_streaming:
                continue
            reply_type = getattr(agent_pb2, rpc.output_type.name)
            call: Any = channel.unary_unary(
                f"/{service.full_name}/{rpc.name}", response_deserializer=reply_type.FromString
            )
            assert call(b"", timeout=10) == reply_type()
        method, request = WATCH
        watch: Any = channel.unary_stream(method)
        stream = watch(bytes.fromhex(request), timeout=30)
        started = time.monotonic()
        got = [next(stream) for _ in range(2)]
        stream.cancel()
        assert got == [b"", b""]
        assert time.monotonic() - started >= 0.9  # The second message a second after the first.
