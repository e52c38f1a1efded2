"""Hostile requests against the real daemon: random names, sizes and selectors for every
RPC. Each must end in OK or a deliberate refusal, never INTERNAL or UNKNOWN, and nothing may
appear outside the fake cgroup mount. HANDLER_EXAMPLES requests are tried per RPC."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guestagent.host.client import AgentClient
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.agentproc import AgentProcess
from tests.fakes.root import FakeRoot, make_fake_root

# Thousands of examples: `make test` runs them, `make unit` does not.
pytestmark = pytest.mark.slow

HANDLER_EXAMPLES = 150
REFUSALS = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}

names = st.one_of(
    st.text(max_size=40),
    st.lists(
        st.sampled_from(["pod", "ctr", "..", ".", "", "x" * 300, "a\x00b", "%2e%2e"]), max_size=5
    ).map("/".join),
    st.sampled_from(["/etc", "../../etc", "pod/../../..", "escape", "escape/x"]),
)
sizes = st.one_of(
    st.none(), st.integers(-(2**63), 2**63 - 1), st.sampled_from([-1, 0, 1, 4095, 64 << 20])
)


@pytest.fixture(scope="module")
def fuzz_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProcess, FakeRoot]]:
    workdir = tmp_path_factory.mktemp("fuzz")
    fake = make_fake_root(workdir / "root")
    fake.add_cgroup("pod/ctr")
    outside = workdir / "root" / "outside"
    outside.mkdir()
    os.symlink(outside, fake.root / "sys/fs/cgroup/escape")
    process = AgentProcess(fake.root, workdir)
    process.start()
    yield process, fake
    process.kill()


def files_outside_the_mount(fake: FakeRoot) -> list[Path]:
    mount = fake.root / "sys/fs/cgroup"
    return [
        p
        for p in fake.root.rglob("*")
        if mount not in p.parents
        and p != mount
        and p.is_file()
        and "sys/fs/cgroup" not in str(p)
        and p.parent.name == "outside"
    ]


def call(fuzz_agent: tuple[AgentProcess, FakeRoot], rpc: Callable[[AgentClient], Any]) -> None:
    process, fake = fuzz_agent
    with AgentClient(process.unix_target, timeout=30) as client:
        try:
            rpc(client)
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
            assert code in REFUSALS, f"{code.name}: {e.details()}"
    assert not files_outside_the_mount(fake)


FUZZ = settings(
    max_examples=HANDLER_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(cgroups=st.lists(names, max_size=4))
def test_get_memory_info(fuzz_agent: tuple[AgentProcess, FakeRoot], cgroups: list[str]) -> None:
    call(fuzz_agent, lambda c: c.info(cgroups))


@FUZZ
@given(
    cgroup=names,
    limit=sizes,
    swap=sizes,
    reservation=sizes,
    create=st.booleans(),
    swappiness=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
)
def test_set_memory_limits(
    fuzz_agent: tuple[AgentProcess, FakeRoot],
    cgroup: str,
    limit: int | None,
    swap: int | None,
    reservation: int | None,
    create: bool,
    swappiness: int | None,
) -> None:
    memory = pb.LinuxMemory(limit=limit, swap=swap, reservation=reservation, swappiness=swappiness)
    call(fuzz_agent, lambda c: c.set_limits(cgroup, memory, create))


@FUZZ
@given(
    path=st.one_of(
        st.none(),
        st.text(max_size=40),
        st.sampled_from(["/dev/../etc/passwd", "/dev/null", "/dev/zero", "/dev/vdz"]),
    ),
    serial=st.one_of(st.none(), st.text(max_size=20)),
    priority=st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
    discard=st.integers(0, 9),
)
def test_enable_and_disable_swap(
    fuzz_agent: tuple[AgentProcess, FakeRoot],
    path: str | None,
    serial: str | None,
    priority: int | None,
    discard: int,
) -> None:
    selector = (
        pb.DeviceSelector(path=path) if path is not None else pb.DeviceSelector(serial=serial or "")
    )
    request = pb.EnableSwapRequest(device=selector, discard=discard, wait_ms=0)  # type: ignore[arg-type]
    if priority is not None:
        request.priority = priority
    call(fuzz_agent, lambda c: c.enable_swap(request))
    call(fuzz_agent, lambda c: c.disable_swap(selector))


@FUZZ
@given(
    cgroup=names,
    size=st.integers(-(2**63), 2**63 - 1),
    drop=st.integers(0, 2**32 - 1),
    node=st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
)
def test_reclaim_compact_overhead(
    fuzz_agent: tuple[AgentProcess, FakeRoot],
    cgroup: str,
    size: int,
    drop: int,
    node: int | None,
) -> None:
    call(fuzz_agent, lambda c: c.reclaim(cgroup, size, drop))
    call(fuzz_agent, lambda c: c.compact(node))
    call(fuzz_agent, lambda c: c.overhead([cgroup]))
