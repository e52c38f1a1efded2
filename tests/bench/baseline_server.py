"""The benchmark's yardstick: a bare grpc.aio server with only the health service."""

import asyncio
import sys

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


async def main(target: str) -> None:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(target)
    await server.start()
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
