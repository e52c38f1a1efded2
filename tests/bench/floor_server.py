"""The floor: the least a grpcio server can be. One method on raw bytes (no protobuf, no
contract), grpc.aio, no ssl, run with -OO. Whatever the agent costs above this is its own.

Usage: python -OO floor_server.py unix:///path
"""

import sys

METHOD = "/floor.Floor/Echo"


def main(target: str) -> None:
    # asyncio imports ssl if it can; a server without TLS never uses it.
    sys.modules["ssl"] = None  # type: ignore[assignment]
    import asyncio

    import grpc

    async def echo(request: bytes, context: object) -> bytes:
        return request

    async def run() -> None:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            "floor.Floor", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
        )
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(target)
        await server.start()
        await server.wait_for_termination()

    asyncio.run(run())


if __name__ == "__main__":
    main(sys.argv[1])
