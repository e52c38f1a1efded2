"""The contract yardstick: the floor serving the agent's contract and none of the agent. The
generated service of guestagent.v1 (protobuf, the contract's descriptors and message classes)
with every method answering its reply type's empty message, WatchMemory one a second (the
agent's default interval), and health's Check answered SERVING in raw bytes, as the floor
answers. protobuf's unused modules are loaded on use, as the agent's entry() has them, so this
holds no more of protobuf than the agent does. What the agent holds above this server is its
own: the daemon, the reports, the operations, the data of real replies. The floor
(floor_server.py) measures the agent against grpcio alone; this measures it against grpcio and
the contract it has to serve in protobuf.

Usage: python -OO contract_server.py unix:///path
"""

import sys
from typing import Any

SERVING = b"\x08\x01"  # grpc.health.v1.HealthCheckResponse{status: SERVING}


def main(target: str) -> None:
    sys.modules["ssl"] = None  # type: ignore[assignment]  # As the floor: no TLS, no ssl.
    from guestagent.load_on_use import load_on_use

    load_on_use()
    import asyncio

    import grpc

    from guestagent.v1 import agent_pb2, agent_pb2_grpc

    class EmptyReplies:
        """Every method of the service, each answering its reply type's default."""

    for method in agent_pb2.DESCRIPTOR.services_by_name["MemoryAgent"].methods:
        setattr(
            EmptyReplies, method.name, answer(method, getattr(agent_pb2, method.output_type.name))
        )

    async def check(request: bytes, context: object) -> bytes:
        return SERVING

    async def run() -> None:
        server = grpc.aio.server()
        servicer: Any = EmptyReplies()
        agent_pb2_grpc.add_MemoryAgentServicer_to_server(servicer, server)
        health: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            "Check": grpc.unary_unary_rpc_method_handler(check)
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("grpc.health.v1.Health", health),)
        )
        server.add_insecure_port(target)
        await server.start()
        await server.wait_for_termination()

    asyncio.run(run())


def answer(method: Any, reply_type: type) -> object:
    """The servicer method for one rpc: its empty reply, once or (a server stream) a second."""
    import asyncio

    if method.server_streaming:

        async def stream(self: object, request: object, context: object) -> object:
            while True:
                yield reply_type()
                await asyncio.sleep(1)

        return stream

    async def unary(self: object, request: object, context: object) -> object:
        return reply_type()

    return unary


if __name__ == "__main__":
    main(sys.argv[1])
