"""The interceptor that refuses undecodable requests: its handlers are made once a method."""

from __future__ import annotations

from typing import Any, cast

import grpc

from guestagent.agent.peers import PeerTable
from guestagent.agent.undecodable import Undecodable, UndecodableRequests


class Call(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def handler() -> Any:
    return grpc.unary_unary_rpc_method_handler(
        lambda request, context: request, request_deserializer=lambda data: int(data)
    )


async def test_a_methods_tolerant_handler_is_made_once_for_its_handler() -> None:
    interceptor = UndecodableRequests(PeerTable())
    say, other = handler(), handler()

    async def services(details: grpc.HandlerCallDetails) -> Any:
        return say

    first = cast(Any, await interceptor.intercept_service(services, Call("/test.Echo/Say")))
    assert first.request_deserializer(b"12") == 12
    assert first.request_deserializer(b"x") == Undecodable(
        1, "ValueError: invalid literal for int() with base 10: b'x'"
    )
    assert await interceptor.intercept_service(services, Call("/test.Echo/Say")) is first

    async def rebuilt(details: grpc.HandlerCallDetails) -> Any:
        return other  # A service whose handlers were built again: its own tolerant one.

    again = cast(Any, await interceptor.intercept_service(rebuilt, Call("/test.Echo/Say")))
    assert again is not first and again.request_deserializer(b"7") == 7
