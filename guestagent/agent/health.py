"""The gRPC health service (grpc.health.v1.Health), answered without protobuf.

grpc_health's servicer imports its generated messages, and with them protobuf's Python layer,
at start: about 1 MiB of every guest's memory (docs/measurements.md, 2026-12-06) for two
messages, a string and an enum. The contract's own code loads protobuf at its first call
(agent/first_call.py); until then this module answers health checks with its own few bytes
of wire format (protobuf.dev/programming-guides/encoding; the tests check both directions
against grpc_health's messages).

It behaves as grpc_health's aio servicer does: Check of a service with no status is NOT_FOUND;
Watch sends the status at once and then the status whenever it differs from the last sent
(SERVICE_UNKNOWN until one is set; a change and its undoing between two sends send nothing);
List is UNIMPLEMENTED; after enter_graceful_shutdown every service is NOT_SERVING for good.
It differs in two ways. It refuses a request over MAX_REQUEST_BYTES, which upb would have
decoded. And at enter_graceful_shutdown a Watch stream sends its last status and ends (OK),
as the agent's WatchMemory streams end: grpc_health's stays open, so a caller that keeps one
holds the server's stop for the whole grace period, and with it the pod VM's shutdown. A
client-side health checker (gRFC A17) takes a Watch that ends with any status but
UNIMPLEMENTED as unhealthy, which the NOT_SERVING before it has already said.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, TypeAlias

import grpc

if TYPE_CHECKING:  # grpc.aio.ServicerContext is generic only in its type stubs.
    Context: TypeAlias = grpc.aio.ServicerContext[str, int]

SERVICE_NAME = "grpc.health.v1.Health"

# HealthCheckResponse.ServingStatus.
UNKNOWN = 0
SERVING = 1
NOT_SERVING = 2
SERVICE_UNKNOWN = 3

_SERVICE_FIELD = 1  # HealthCheckRequest.service; HealthCheckResponse.status is field 1 too.
_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5
_MAX_VARINT_BYTES = 10
_MAX_TAG_BYTES = 5  # A tag is a 32-bit varint: upb refuses a longer one.
# The request is decoded on the event loop's thread, field by field in Python: a few hundred
# times upb's time, so 4 MiB of one-byte fields would hold every call for seconds. A service
# name is a protobuf service's full name, tens of bytes.
MAX_REQUEST_BYTES = 4096
_MAX_FIELD_NUMBER = (1 << 29) - 1
# Groups nested deeper are refused, as upb refuses them (its default depth limit), before
# Python's recursion limit would.
MAX_GROUP_DEPTH = 100


class HealthDecodeError(ValueError):
    """The bytes are not a HealthCheckRequest."""


def decode_request(data: bytes) -> str:
    """A HealthCheckRequest's service name. Other fields are skipped, as protobuf skips fields
    it does not know; the last service field wins, as protobuf's does."""
    if len(data) > MAX_REQUEST_BYTES:
        raise HealthDecodeError(
            f"the request is {len(data)} bytes, over the {MAX_REQUEST_BYTES} a service name needs"
        )
    service = ""
    at = 0
    while at < len(data):
        number, wire_type, at = _read_tag(data, at)
        if number == _SERVICE_FIELD and wire_type == _LEN:
            length, at = _read_varint(data, at)
            end = _within(data, at, length)
            try:
                service = data[at:end].decode("utf-8")
            except UnicodeDecodeError as e:
                raise HealthDecodeError("the service name is not UTF-8") from e
            at = end
        else:
            at = _skip(data, at, number, wire_type)
    return service


def encode_response(status: int) -> bytes:
    """A HealthCheckResponse: the status as field 1, left out when 0 (proto3's default)."""
    return bytes((_SERVICE_FIELD << 3 | _VARINT, status)) if status else b""


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = 0
    for i in range(_MAX_VARINT_BYTES):
        if at + i >= len(data):
            raise HealthDecodeError("a varint runs past the end")
        byte = data[at + i]
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return value, at + i + 1
    raise HealthDecodeError("a varint is longer than 10 bytes")


def _read_tag(data: bytes, at: int) -> tuple[int, int, int]:
    tag, end = _read_varint(data, at)
    if end - at > _MAX_TAG_BYTES:
        raise HealthDecodeError(f"a tag is {end - at} bytes long")
    at = end
    number, wire_type = tag >> 3, tag & 7
    if not 0 < number <= _MAX_FIELD_NUMBER:
        raise HealthDecodeError(f"field number {number} is out of range")
    return number, wire_type, at


def _within(data: bytes, at: int, length: int) -> int:
    if length > len(data) - at:
        raise HealthDecodeError("a field runs past the end")
    return at + length


def _skip(data: bytes, at: int, number: int, wire_type: int, depth: int = 0) -> int:
    """Past one field of `wire_type` whose tag ends at `at`, inside `depth` groups."""
    if wire_type == _VARINT:
        return _read_varint(data, at)[1]
    if wire_type == _I64:
        return _within(data, at, 8)
    if wire_type == _I32:
        return _within(data, at, 4)
    if wire_type == _LEN:
        length, at = _read_varint(data, at)
        return _within(data, at, length)
    if wire_type == _SGROUP:
        if depth >= MAX_GROUP_DEPTH:
            raise HealthDecodeError(f"groups are nested over {MAX_GROUP_DEPTH} deep")
        while True:
            if at >= len(data):
                raise HealthDecodeError(f"group {number} is not closed")
            inner, inner_type, at = _read_tag(data, at)
            if inner_type == _EGROUP:
                if inner != number:
                    raise HealthDecodeError(f"group {number} is closed as {inner}")
                return at
            at = _skip(data, at, inner, inner_type, depth + 1)
    raise HealthDecodeError(f"field {number} has wire type {wire_type}")


class HealthService:
    """The health statuses the daemon sets, served to Check and Watch."""

    def __init__(self) -> None:
        self._statuses: dict[str, int] = {}
        self._changed = asyncio.Condition()
        self._shutting_down = False

    def add_to(self, server: grpc.aio.Server) -> None:
        """Registered as generated code registers a service, not as a generic handler: so
        registered, a health check sent behind 2000 queued calls was answered in three runs of
        three, where as a generic handler it was refused at the 512-call cap in three of three
        (tests/hostile's test_many_concurrent_unary_calls)."""
        server.add_registered_method_handlers(
            SERVICE_NAME,
            {
                "Check": grpc.unary_unary_rpc_method_handler(
                    self._check,
                    request_deserializer=decode_request,
                    response_serializer=encode_response,
                ),
                "Watch": grpc.unary_stream_rpc_method_handler(
                    self._watch,
                    request_deserializer=decode_request,
                    response_serializer=encode_response,
                ),
            },
        )

    async def set(self, service: str, status: int) -> None:
        """The service's status from now on; ignored once shutting down."""
        async with self._changed:
            if not self._shutting_down:
                self._statuses[service] = status
                self._changed.notify_all()

    async def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING, no set() heard after, and every Watch stream ended once
        it has sent its last status."""
        async with self._changed:
            self._shutting_down = True
            for service in self._statuses:
                self._statuses[service] = NOT_SERVING
            self._changed.notify_all()  # Watchers of a service with no status too.

    async def _check(self, service: str, context: Context) -> int:
        status = self._statuses.get(service)
        if status is None:
            # Named, but not whole: a long name in the trailer could pass the caller's metadata
            # limit and turn NOT_FOUND into another code.
            named = service if len(service) <= 200 else f"{service[:200]}..."
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no health status for {named!r}")
        return status

    async def _watch(self, service: str, context: Context) -> AsyncIterator[int]:
        # The lock is not held across a yield: a slow watcher must not hold up set().
        sent: int | None = None
        while True:
            status = self._statuses.get(service, SERVICE_UNKNOWN)
            if status != sent:
                sent = status
                yield status
                continue  # It may have changed while the caller read it.
            if self._shutting_down:
                return  # Its last status is sent, and no set() is heard now.
            async with self._changed:
                unchanged = self._statuses.get(service, SERVICE_UNKNOWN) == sent
                if unchanged and not self._shutting_down:
                    await self._changed.wait()
