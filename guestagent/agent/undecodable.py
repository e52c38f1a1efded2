"""Requests that do not decode: INVALID_ARGUMENT and an audit line, not grpc's UNKNOWN.

grpc decodes a request before any servicer code runs, and answers a DecodeError with
`UNKNOWN: Unexpected DecodeError` and nothing in the agent's log. This interceptor gives each
unary and server-streaming method a decoder that hands such a request on as `Undecodable`,
which the method's wrapper refuses (and audits) before the servicer sees it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from guestagent.agent.audit import audit_undecodable
from guestagent.agent.peers import PeerTable
from guestagent.records import record

if TYPE_CHECKING:  # grpc.RpcMethodHandler is generic only in its type stubs.
    Handler: TypeAlias = grpc.RpcMethodHandler[Any, Any]


@record
class Undecodable:
    size: int
    error: str


class UndecodableRequests(grpc.aio.ServerInterceptor):
    def __init__(self, peers: PeerTable) -> None:
        self._peers = peers
        # Each method's handler and its tolerant version, made at its first call: grpc asks
        # for a handler at every call, and the services give the same one each time.
        self._tolerant: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        made = self._tolerant.get(details.method)
        if made is not None and made[0] is handler:
            return made[1]
        tolerant = self._tolerant_handler(details, handler, _tolerant(handler.request_deserializer))
        self._tolerant[details.method] = (handler, tolerant)
        return tolerant

    def _tolerant_handler(
        self, details: grpc.HandlerCallDetails, handler: Handler, decode: Callable[[bytes], Any]
    ) -> Handler:
        method = str(details.method).rpartition("/")[2]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary),
                request_deserializer=decode,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, handler.unary_stream),
                request_deserializer=decode,
                response_serializer=handler.response_serializer,
            )
        return handler

    async def _refuse(self, method: str, request: Undecodable, context: Any) -> None:
        started = time.monotonic()
        details = f"the request does not decode as {method}'s message: {request.error}"
        audit_undecodable(
            method, self._peers.caller(context.peer()), request.size, details, started
        )
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, details)

    def _unary(self, method: str, behaviour: Any) -> Any:
        async def unary(request: Any, context: Any) -> Any:
            if isinstance(request, Undecodable):
                await self._refuse(method, request, context)
            return await behaviour(request, context)

        return unary

    def _stream(self, method: str, behaviour: Any) -> Any:
        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await self._refuse(method, request, context)
            async for item in behaviour(request, context):
                yield item

        return stream


def _tolerant(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def tolerant(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception as e:  # protobuf's DecodeError, or any other refusal of the bytes.
            # Its words too (a message type, a length, a field number), never the bytes.
            return Undecodable(
                len(data), f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            )

    return tolerant
