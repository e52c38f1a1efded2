"""The daemon: listeners (unix, tcp, vsock through the relay), health, reflection, shutdown."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from guestagent import errors
from guestagent.agent.rpc import SERVICE_NAME, MemoryAgentServicer
from guestagent.jsonlog import EventLog
from guestagent.linux.fs import KernelFS
from guestagent.ops.hotplug import HotplugWatcher
from guestagent.ops.reclaimer import Reclaimer
from guestagent.ops.swap import SwapManager
from guestagent.transport import (
    Address,
    SocketRelay,
    TcpAddress,
    UnixAddress,
    VsockAddress,
    dial_unix,
    grpc_target,
    open_vsock_listener,
    vsock_admitter,
)
from guestagent.v1 import agent_pb2_grpc as pb_grpc

log = EventLog("guestagent.daemon")

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# grpc-core cancels a call that waits over 30 s (its default) for the server to take it up.
# A slow or overcommitted guest can queue that long under load; the caller's own deadline,
# not a server-side timer it cannot see, should decide when to give up.
MAX_UNREQUESTED_SECONDS = 600


@dataclass
class ServerConfig:
    listen: tuple[Address, ...]
    fs: KernelFS = field(default_factory=KernelFS)
    allowed_cids: frozenset[int] = frozenset({2})
    grace_seconds: float = 10.0
    # How hot-plugged memory is onlined ("online", "online_movable"); None leaves it offline.
    online_memory: str | None = "online"
    # Cgroups the working-set reclaimer starts on with the default policy, unless the host
    # already set theirs (kept under /run across restarts).
    reclaim: tuple[str, ...] = ()


class Agent:
    """A started server with its listeners; stop() drains it."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.stopping = asyncio.Event()
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.server_max_unrequested_time_in_server", MAX_UNREQUESTED_SECONDS),
            ]
        )
        self.health = health.aio.HealthServicer()
        self.relays: list[SocketRelay] = []
        self.bound: list[str] = []
        self._private_dir: Path | None = None
        self.hotplug = HotplugWatcher(config.fs, config.online_memory or "online")
        self.reclaimer = Reclaimer(config.fs)
        pb_grpc.add_MemoryAgentServicer_to_server(
            MemoryAgentServicer(
                config.fs, self.stopping, SwapManager(config.fs), self.hotplug, self.reclaimer
            ),
            self.server,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )

    async def start(self) -> None:
        for address in self.config.listen:
            self._bind(address)
        await self.server.start()
        for relay in self.relays:
            relay.start()
        if self.config.online_memory is not None and self.config.fs.is_real:
            # On its own thread: onlining many blocks must not hold up any call.
            await asyncio.to_thread(self.hotplug.start)
        # Off unless the host (now or before a restart) or --reclaim turned it on.
        await asyncio.to_thread(self.reclaimer.start, self.config.reclaim)
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving", listen=self.bound, allowed_cids=sorted(self.config.allowed_cids))

    def _bind(self, address: Address) -> None:
        if isinstance(address, UnixAddress):
            Path(address.path).unlink(missing_ok=True)
            self._add_port(grpc_target(address))
            # Only root in the guest may call: a container must not set its own limits.
            os.chmod(address.path, 0o600)
            self.bound.append(f"unix://{address.path}")
        elif isinstance(address, TcpAddress):
            port = self._add_port(grpc_target(address))
            if not address.is_loopback:
                log.warning("tcp_listen_not_loopback", host=address.host, port=port)
            self.bound.append(f"tcp://{grpc_target(TcpAddress(address.host, port))}")
        elif isinstance(address, VsockAddress):
            upstream = self._private_socket()
            listener = open_vsock_listener(address)
            self.relays.append(
                SocketRelay(
                    listener,
                    dial=lambda: dial_unix(upstream),
                    admit=vsock_admitter(self.config.allowed_cids),
                    name=f"vsock-{address.port}",
                )
            )
            self.bound.append(f"vsock://{listener.getsockname()[0]}:{address.port}")
        else:
            raise errors.InvalidArgument(f"cannot listen on {address}")

    def _add_port(self, target: str) -> int:
        port: int = self.server.add_insecure_port(target)
        if port == 0:
            raise errors.FailedPrecondition(f"cannot bind {target}")
        return port

    def _private_socket(self) -> str:
        """The unix socket vsock relays dial: in a 0700 directory only this process can enter."""
        if self._private_dir is None:
            self._private_dir = Path(tempfile.mkdtemp(prefix="guestagent-"))
            self._add_port(f"unix://{self._private_dir / 'grpc.sock'}")
        return str(self._private_dir / "grpc.sock")

    async def stop(self) -> None:
        log.info("stopping", grace_seconds=self.config.grace_seconds)
        await self.health.enter_graceful_shutdown()
        for relay in self.relays:
            relay.close()
        self.stopping.set()  # Ends watch streams, so only unary calls hold the grace period.
        self.hotplug.stop()
        await asyncio.to_thread(self.reclaimer.stop)
        await self.server.stop(self.config.grace_seconds)
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
        log.info("stopped")


async def serve(config: ServerConfig) -> None:
    """Run until SIGTERM or SIGINT, then stop accepting and let in-flight calls finish."""
    agent = Agent(config)
    await agent.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await agent.stop()
