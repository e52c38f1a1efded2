"""The floor: the least a grpcio server can be. Unary methods and one server stream on raw
bytes (no protobuf, no contract), grpc.aio, no ssl. Whatever the agent costs above this is its
own. Echo answers what it is sent (sent nothing, it does nothing); Answer sends ANSWER_BYTES
already encoded, as many as a GetMemoryInfo's answer for one cgroup on the bench's fake root.
The stream is the floor's side of the footprint bench's watch phase: one message a second, as
an agent's WatchMemory sends by default.

Usage: python -OO floor_server.py unix:///path
"""

import sys

METHOD = "/floor.Floor/Echo"
ANSWER_METHOD = "/floor.Floor/Answer"
STREAM_METHOD = "/floor.Floor/Ticks"
ANSWER_BYTES = 701


def main(target: str) -> None:
    # asyncio imports ssl if it can; a server without TLS never uses it.
    sys.modules["ssl"] = None  # type: ignore[assignment]
    import asyncio

    import grpc

    async def echo(request: bytes, context: object) -> bytes:
        return request

    answer = b"x" * ANSWER_BYTES

    async def fixed(request: bytes, context: object) -> bytes:
        return answer

    async def ticks(request: bytes, context: object) -> object:
        while True:
            yield request
            await asyncio.sleep(1)

    async def run() -> None:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            "floor.Floor",
            {
                "Echo": grpc.unary_unary_rpc_method_handler(echo),
                "Answer": grpc.unary_unary_rpc_method_handler(fixed),
                "Ticks": grpc.unary_stream_rpc_method_handler(ticks),
            },
        )
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(target)
        await server.start()
        await server.wait_for_termination()

    asyncio.run(run())


if __name__ == "__main__":
    main(sys.argv[1])
