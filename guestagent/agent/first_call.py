"""gRPC services whose servicer is built when their first call arrives, so the modules behind
it load then and not at start: the agent's own service (its wire conversions, its reports and
every operation a call may run) and server reflection (grpc_reflection and its descriptors).
A guest whose host has not called yet holds none of that code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import grpc

from guestagent.agent.on_first_use import OnFirstUse
from guestagent.jsonlog import EventLog

log = EventLog("guestagent.first_call")


class HandlerRecorder:
    """Stands in for the server when generated code registers a servicer, keeping the method
    handlers it would have added. The unary methods named in encoded_answers answer bytes
    their servicer encoded (agent/shared_answers.py): grpc sends them as they are."""

    def __init__(self, encoded_answers: frozenset[str] = frozenset()) -> None:
        self.handlers: list[grpc.GenericRpcHandler] = []
        self._encoded_answers = encoded_answers

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, methods: dict[str, Any]) -> None:
        methods = {
            name: answered_encoded(name, handler) if name in self._encoded_answers else handler
            for name, handler in methods.items()
        }
        # Found before the generic handlers generated code adds beside them, as grpc's server
        # finds registered methods first.
        self.handlers.insert(0, grpc.method_handlers_generic_handler(service, methods))


def answered_encoded(
    method: str, handler: grpc.RpcMethodHandler[Any, Any]
) -> grpc.RpcMethodHandler[Any, Any]:
    """A unary handler whose behaviour returns its answer encoded: no serializer, grpc sends
    the bytes."""
    if handler.unary_unary is None:
        raise TypeError(f"{method} is not a unary method: its answers cannot be sent encoded")
    return grpc.unary_unary_rpc_method_handler(
        handler.unary_unary, request_deserializer=handler.request_deserializer
    )


def recorded_handlers(
    register: Callable[[HandlerRecorder], None], encoded_answers: frozenset[str] = frozenset()
) -> list[grpc.GenericRpcHandler]:
    """The handlers `register` adds to a server (a generated add_*Servicer_to_server)."""
    recorder = HandlerRecorder(encoded_answers)
    register(recorder)
    return recorder.handlers


class ServiceOnFirstCall(grpc.GenericRpcHandler):
    """The methods of one service, whose handlers `load` builds at the service's first call.

    grpc asks a generic handler for every call, on the event loop's thread, so the first
    call to the service waits for its imports (a few tens of milliseconds on a host, a few
    hundred under TCG); later calls find the handlers built. A load that fails is logged and
    its call refused with INTERNAL, naming the error; the next call loads again.
    """

    def __init__(self, service_name: str, load: Callable[[], list[grpc.GenericRpcHandler]]):
        self._name = service_name
        self._prefix = f"/{service_name}/"
        self._handlers = OnFirstUse(load, service_name)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method: str = handler_call_details.method
        if not method.startswith(self._prefix):
            return None
        try:
            handlers = self._handlers()
        except Exception as error:
            log.error("service_not_loaded", exc=True, service=self._name)
            return refusal(f"{self._name} did not load ({type(error).__name__}: {error})")
        for handler in handlers:
            found = handler.service(handler_call_details)
            if found is not None:
                return found
        return None


def refusal(details: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler that refuses any call, unary or streaming either way, with INTERNAL: it
    reads nothing and answers at once."""

    async def refuse(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.INTERNAL, details)

    return grpc.stream_stream_rpc_method_handler(refuse)
