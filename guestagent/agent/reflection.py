"""Server reflection (grpcurl, grpc_cli), built at its first call (agent/first_call.py):
grpc_reflection and its descriptors would cost every guest memory at start for a service a
person calls now and then."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from guestagent.agent.first_call import recorded_handlers

# grpc_reflection.v1alpha.reflection.SERVICE_NAME, named here so start-up need not import it.
SERVICE_NAME = "grpc.reflection.v1alpha.ServerReflection"


def reflection_handlers(service_names: Sequence[str]) -> list[grpc.GenericRpcHandler]:
    """The reflection service's handlers, listing service_names and itself. The services'
    descriptors must be in protobuf's default pool by then."""
    from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

    servicer = reflection.aio.ReflectionServicer((*service_names, SERVICE_NAME))
    return recorded_handlers(
        lambda server: reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    )
