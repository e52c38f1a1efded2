"""A service's handlers built at its first call, once, and asked of no other service's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from guestagent.agent.first_call import ServiceOnFirstCall, recorded_handlers


class Call(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def echo_handlers(loads: list[str]) -> list[grpc.GenericRpcHandler]:
    loads.append("loaded")
    echo: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(
        lambda request, context: request
    )
    return recorded_handlers(
        lambda server: server.add_registered_method_handlers("test.Echo", {"Say": echo})
    )


def test_other_services_calls_load_nothing() -> None:
    loads: list[str] = []
    service = ServiceOnFirstCall("test.Echo", lambda: echo_handlers(loads))
    assert service.service(Call("/grpc.health.v1.Health/Check")) is None
    # A service whose name the one's begins with is another service.
    assert service.service(Call("/test.EchoMore/Say")) is None
    assert loads == []


def test_the_first_call_loads_once_and_later_calls_find_the_handler() -> None:
    loads: list[str] = []
    service = ServiceOnFirstCall("test.Echo", lambda: echo_handlers(loads))
    first = service.service(Call("/test.Echo/Say"))
    assert first is not None
    assert service.service(Call("/test.Echo/Say")) is first
    assert loads == ["loaded"]


def test_a_method_the_service_lacks_is_unimplemented_after_loading() -> None:
    loads: list[str] = []
    service = ServiceOnFirstCall("test.Echo", lambda: echo_handlers(loads))
    assert service.service(Call("/test.Echo/Shout")) is None  # grpc: UNIMPLEMENTED.
    assert loads == ["loaded"]


def failing_once(loads: list[str]) -> list[grpc.GenericRpcHandler]:
    if not loads:
        loads.append("failed")
        raise ImportError("no module named test_echo_pb2")
    return echo_handlers(loads)


def test_a_load_that_fails_refuses_its_call_and_the_next_call_loads_again() -> None:
    loads: list[str] = []
    service = ServiceOnFirstCall("test.Echo", lambda: failing_once(loads))
    refused = service.service(Call("/test.Echo/Say"))
    assert refused is not None and refused.request_streaming and refused.response_streaming
    loaded = service.service(Call("/test.Echo/Say"))
    assert loaded is not None and not loaded.request_streaming
    assert loads == ["failed", "loaded"]


@pytest.mark.parametrize("kind", ["unary_unary", "unary_stream", "stream_stream"])
async def test_the_refusal_reaches_every_kind_of_call_as_internal(
    tmp_path: Path, kind: str
) -> None:
    def fail() -> list[grpc.GenericRpcHandler]:
        raise ImportError("no module named test_echo_pb2")

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([ServiceOnFirstCall("test.Echo", fail)])
    server.add_insecure_port(f"unix://{tmp_path}/echo.sock")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{tmp_path}/echo.sock") as channel:
            method: Any = getattr(channel, kind)("/test.Echo/Say")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                if kind == "unary_unary":
                    await method(b"x", timeout=10)
                elif kind == "unary_stream":
                    await method(b"x", timeout=10).read()
                else:
                    # No request: once, on a loaded host, the client saw grpc core's own
                    # "Internal error from Core" instead of the refusal's details, likely a
                    # request still being written as the refusal closed the stream.
                    await method(iter([]), timeout=10).read()
    finally:
        await server.stop(None)
    assert refused.value.code() == grpc.StatusCode.INTERNAL
    assert refused.value.details() == (
        "test.Echo did not load (ImportError: no module named test_echo_pb2)"
    )


def test_generic_handlers_a_servicer_adds_are_recorded() -> None:
    generic = grpc.method_handlers_generic_handler("test.Echo", {})
    assert recorded_handlers(lambda server: server.add_generic_rpc_handlers([generic])) == [generic]


def test_an_encoded_answer_is_sent_as_it_is_and_registered_methods_come_first() -> None:
    def add(server: Any) -> None:
        echo: Any = grpc.unary_unary_rpc_method_handler(
            lambda request, context: request, response_serializer=lambda answer: b"serialized"
        )
        methods = {"Say": echo, "Shout": echo}
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("test.Echo", methods)]
        )
        server.add_registered_method_handlers("test.Echo", methods)

    first, _ = recorded_handlers(add, frozenset({"Say"}))
    say: Any = first.service(Call("/test.Echo/Say"))
    shout: Any = first.service(Call("/test.Echo/Shout"))
    assert say.response_serializer is None
    assert shout.response_serializer(None) == b"serialized"


def test_the_daemon_names_the_contracts_service() -> None:
    from guestagent.agent.daemon import SERVICE_NAME
    from guestagent.v1 import agent_pb2

    assert agent_pb2.DESCRIPTOR.services_by_name["MemoryAgent"].full_name == SERVICE_NAME
