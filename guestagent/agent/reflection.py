"""Server reflection (grpcurl, grpc_cli) loaded by its first call: grpc_reflection and its
descriptors cost every guest memory at start for a service a person calls now and then."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import grpc

# grpc_reflection.v1alpha.reflection.SERVICE_NAME, named here so start-up need not import it.
SERVICE_NAME = "grpc.reflection.v1alpha.ServerReflection"


class _Recorder:
    """Stands in for the server when grpc_reflection registers its servicer, keeping the
    method handlers it would have added."""

    def __init__(self) -> None:
        self.handlers: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, methods: dict[str, Any]) -> None:
        self.handlers.append(grpc.method_handlers_generic_handler(service, methods))


class LazyReflection(grpc.GenericRpcHandler):
    """The reflection service of an aio server, listing service_names; grpc_reflection is
    imported when a call to it first arrives."""

    def __init__(self, service_names: Sequence[str]) -> None:
        self.service_names = (*service_names, SERVICE_NAME)
        self._handlers: list[grpc.GenericRpcHandler] | None = None

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method: str = handler_call_details.method
        if not method.startswith(f"/{SERVICE_NAME}/"):
            return None
        if self._handlers is None:
            self._handlers = load_reflection(self.service_names)
        for handler in self._handlers:
            found = handler.service(handler_call_details)
            if found is not None:
                return found
        return None


def load_reflection(service_names: Sequence[str]) -> list[grpc.GenericRpcHandler]:
    from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

    recorder = _Recorder()
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        reflection.aio.ReflectionServicer(service_names), recorder
    )
    return recorder.handlers
