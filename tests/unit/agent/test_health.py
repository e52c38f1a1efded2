"""The health service without protobuf: its bytes against grpc_health's own messages (upb), and
its behaviour through a real aio server, called with grpc_health's generated stub."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import example, given, settings
from hypothesis import strategies as st

from guestagent.agent import health
from guestagent.agent.health import HealthDecodeError, decode_request, encode_response

Statuses = health_pb2.HealthCheckResponse


def test_the_statuses_are_the_protocols() -> None:
    assert (health.UNKNOWN, health.SERVING, health.NOT_SERVING, health.SERVICE_UNKNOWN) == (
        Statuses.UNKNOWN,
        Statuses.SERVING,
        Statuses.NOT_SERVING,
        Statuses.SERVICE_UNKNOWN,
    )
    assert health_pb2.DESCRIPTOR.services_by_name["Health"].full_name == health.SERVICE_NAME


@pytest.mark.parametrize("status", [0, 1, 2, 3])
def test_a_response_is_the_messages_bytes(status: int) -> None:
    assert encode_response(status) == Statuses(status=status).SerializeToString()


@given(st.text())
@example("")
@example("guestagent.v1.MemoryAgent")
def test_a_requests_service_decodes(service: str) -> None:
    encoded = health_pb2.HealthCheckRequest(service=service).SerializeToString()
    assert decode_request(encoded) == service


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, wire_type: int, payload: bytes) -> bytes:
    return varint(number << 3 | wire_type) + payload


unknown_fields = st.one_of(
    st.builds(
        lambda n, v: field(n, 0, varint(v)),
        st.integers(2, 1000),
        st.integers(0, (1 << 64) - 1),
    ),
    st.builds(lambda n, b: field(n, 1, b), st.integers(1, 1000), st.binary(min_size=8, max_size=8)),
    st.builds(lambda n, b: field(n, 5, b), st.integers(1, 1000), st.binary(min_size=4, max_size=4)),
    st.builds(
        lambda n, b: field(n, 2, varint(len(b)) + b), st.integers(2, 1000), st.binary(max_size=20)
    ),
    st.builds(lambda n: field(n, 3, field(7, 0, b"\x01")) + field(n, 4, b""), st.integers(1, 1000)),
    st.builds(lambda s: field(1, 2, varint(len(s)) + s), st.text().map(str.encode)),
)


def upb_service(data: bytes) -> str | None:
    try:
        return str(health_pb2.HealthCheckRequest.FromString(data).service)
    except DecodeError:
        return None


def ours(data: bytes) -> str | None:
    try:
        return decode_request(data)
    except HealthDecodeError:
        return None


@given(st.lists(unknown_fields, max_size=6).map(b"".join))
def test_requests_with_other_fields_decode_as_protobuf_decodes_them(data: bytes) -> None:
    assert upb_service(data) is not None
    assert ours(data) == upb_service(data)


@given(st.binary(max_size=40))
@example(b"\x0a\x02\xff\xfe")  # Not UTF-8.
@example(b"\x0a\x05ab")  # Runs past the end.
@example(b"\x00")  # Field 0.
@example(b"\x0f")  # Wire type 7.
@example(b"\x0c")  # An end group with no start.
@example(b"\x0b\x08\x01")  # A group not closed.
@example(b"\x0b\x14")  # A group closed as another.
@example(b"\x08" + b"\xff" * 10 + b"\x01")  # A varint of 11 bytes.
@example(b"\x08\x01")  # The service field as a varint: an unknown field.
@example(b"\x8a\x80\x80\x80\x00\x01a")  # Field 1's tag in 5 bytes.
@example(b"\x8a\x80\x80\x80\x80\x00\x01a")  # In 6: longer than a 32-bit varint.
def test_any_bytes_decode_or_not_as_protobuf_says(data: bytes) -> None:
    assert ours(data) == upb_service(data)


@pytest.mark.slow
@settings(max_examples=5000, deadline=None)
@given(st.one_of(st.binary(max_size=40), st.lists(unknown_fields, max_size=4).map(b"".join)))
def test_many_bytes_decode_or_not_as_protobuf_says(data: bytes) -> None:
    # Truncated too: a cut anywhere in a valid request.
    for cut in {len(data), len(data) // 2, max(0, len(data) - 1)}:
        assert ours(data[:cut]) == upb_service(data[:cut])


@pytest.mark.parametrize("depth", [1, 99, 100, 101, 2000])
def test_groups_nested_deeper_than_upb_allows_are_refused_as_upb_refuses_them(
    depth: int,
) -> None:
    nested = b"\x13" * depth + b"\x14" * depth  # Field 2 groups, each in the last.
    assert ours(nested) == upb_service(nested)
    assert (ours(nested) is None) == (depth > health.MAX_GROUP_DEPTH)


def test_a_request_over_the_limit_is_refused_before_its_fields_are_read() -> None:
    # Any bytes upb would read at once: here each field is a step in Python.
    at_limit = field(2, 0, b"\x00") * (health.MAX_REQUEST_BYTES // 2)
    assert len(at_limit) == health.MAX_REQUEST_BYTES
    assert decode_request(at_limit) == upb_service(at_limit) == ""
    with pytest.raises(HealthDecodeError, match=f"{len(at_limit) + 2} bytes, over the 4096"):
        decode_request(at_limit + field(2, 0, b"\x00"))


class Served:
    """The service on a real aio server, and grpc_health's stub for it."""

    def __init__(self, service: health.HealthService, channel: grpc.aio.Channel) -> None:
        self.service = service
        self.channel = channel
        self.stub = health_pb2_grpc.HealthStub(channel)

    def watch(self, name: str) -> Any:
        return self.stub.Watch(health_pb2.HealthCheckRequest(service=name), timeout=30)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    service = health.HealthService()
    server = grpc.aio.server()
    service.add_to(server)
    server.add_insecure_port(f"unix://{tmp_path}/health.sock")
    await server.start()
    async with grpc.aio.insecure_channel(f"unix://{tmp_path}/health.sock") as channel:
        yield Served(service, channel)
    await server.stop(None)


async def test_check_answers_what_was_set_and_not_found_for_the_rest(
    served: Served,
) -> None:
    service, stub = served.service, served.stub
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert "''" in str(refused.value.details())
    await service.set("", health.SERVING)
    await service.set("pod.Service", health.NOT_SERVING)
    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == Statuses.SERVING
    reply = await stub.Check(health_pb2.HealthCheckRequest(service="pod.Service"), timeout=10)
    assert reply.status == Statuses.NOT_SERVING


async def test_not_found_names_a_long_service_in_part(served: Served) -> None:
    name = "x" * 1000
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await served.stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert f"'{'x' * 200}...'" in str(refused.value.details())
    assert len(str(refused.value.details())) < 300


async def test_list_is_unimplemented_as_grpc_healths_aio_servicer_has_it(
    served: Served,
) -> None:
    channel = served.channel
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        list_call: Any = channel.unary_unary("/grpc.health.v1.Health/List")
        await list_call(b"", timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_watch_sends_the_status_then_each_change(
    served: Served,
) -> None:
    service, stream = served.service, served.watch("x")
    seen = [(await stream.read()).status]
    await service.set("x", health.NOT_SERVING)
    seen.append((await stream.read()).status)
    await service.set("x", health.NOT_SERVING)  # No change: nothing sent.
    await service.set("x", health.SERVING)
    seen.append((await stream.read()).status)
    await service.enter_graceful_shutdown()
    seen.append((await stream.read()).status)
    assert await stream.read() is grpc.aio.EOF
    assert await stream.code() == grpc.StatusCode.OK
    assert seen == [
        Statuses.SERVICE_UNKNOWN,
        Statuses.NOT_SERVING,
        Statuses.SERVING,
        Statuses.NOT_SERVING,
    ]


async def test_at_graceful_shutdown_every_watch_sends_its_last_status_and_ends(
    served: Served,
) -> None:
    """Each stream, whatever it watches, ends (OK) once it has sent its status as the agent
    stops: one held open would hold the server's stop for the whole grace period."""
    service = served.service
    await service.set("", health.SERVING)
    await service.set("idle", health.NOT_SERVING)  # Already what shutdown sets: sent once.
    streams = {name: served.watch(name) for name in ("", "idle", "never.set")}
    for stream in streams.values():
        await stream.read()
    await service.enter_graceful_shutdown()
    late = served.watch("")  # A watch that starts as the agent stops.
    rest: dict[str, list[int]] = {}
    for name, stream in (*streams.items(), ("late", late)):
        rest[name] = []
        while (message := await stream.read()) is not grpc.aio.EOF:
            rest[name].append(message.status)
        assert await stream.code() == grpc.StatusCode.OK, name
    assert rest == {
        "": [Statuses.NOT_SERVING],
        "idle": [],
        "never.set": [],
        "late": [Statuses.NOT_SERVING],
    }


async def test_after_graceful_shutdown_every_service_is_not_serving_for_good(
    served: Served,
) -> None:
    service, stub = served.service, served.stub
    for name in ("", "a", "b"):
        await service.set(name, health.SERVING)
    await service.enter_graceful_shutdown()
    await service.set("a", health.SERVING)
    for name in ("", "a", "b"):
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
        assert reply.status == Statuses.NOT_SERVING


async def test_a_watcher_that_does_not_read_holds_up_no_set(
    served: Served,
) -> None:
    service, stream = served.service, served.watch("x")
    await stream.read()
    for status in [health.SERVING, health.NOT_SERVING] * 50:
        await asyncio.wait_for(service.set("x", status), timeout=10)
    stream.cancel()
