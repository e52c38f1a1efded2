"""The gRPC server: a thin servicer that validates, calls the modules, and maps errors.

Domain errors become status codes in one table (STATUS_BY_ERROR); everything else is a bug
and is logged with its traceback before the caller sees INTERNAL.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from guestagent import errors
from guestagent.cgroups import cgroup_dir
from guestagent.compaction import Compactor
from guestagent.hotplug import HotplugWatcher
from guestagent.jsonlog import EventLog
from guestagent.kernelfs import KernelFS
from guestagent.limits import apply_memory_limits
from guestagent.meminfo import read_report
from guestagent.overhead import guest_overhead
from guestagent.reclaim import reclaim
from guestagent.swap import SwapManager
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
from guestagent.v1 import agent_pb2 as pb
from guestagent.v1 import agent_pb2_grpc as pb_grpc
from guestagent.watch import KernelSignals, PressureTriggerSpec, Signal, pressure_trigger_spec
from guestagent.wire import (
    applied_limits_pb,
    compact_result_pb,
    enable_swap_spec_from_pb,
    memory_info_pb,
    memory_spec_from_pb,
    online_result_pb,
    overhead_pb,
    reclaim_result_pb,
    selector_from_pb,
    swap_area_pb,
)

log = EventLog("guestagent.server")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["MemoryAgent"].full_name
DEFAULT_WATCH_INTERVAL_MS = 1000
MIN_WATCH_INTERVAL_MS = 100
# Signals that arrive within this long of each other are sent as one message.
COALESCE_SECONDS = 0.01
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# grpc-core cancels a call that waits over 30 s (its default) for the server to take it up.
# A slow or overcommitted guest can queue that long under load; the caller's own deadline,
# not a server-side timer it cannot see, should decide when to give up.
MAX_UNREQUESTED_SECONDS = 600
DEADLINE_MARGIN_SECONDS = 0.05

STATUS_BY_ERROR: dict[type[errors.AgentError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.KernelFormat: grpc.StatusCode.INTERNAL,
}


def status_for(error: errors.AgentError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return grpc.StatusCode.INTERNAL


Response = TypeVar("Response")
Handler = Callable[[Any, Any, Any], Awaitable[Response]]


def unary(method: Handler[Response]) -> Handler[Response]:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: Any) -> Response:
        try:
            return await method(self, request, context)
        except errors.AgentError as e:
            await context.abort(status_for(e), str(e))
            raise  # abort() raises; this line only satisfies the type checker.
        except Exception as e:
            log.error("rpc_failed", exc=True, method=method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")
            raise

    return wrapper


def streaming(
    method: Callable[[Any, Any, Any], AsyncIterator[Response]],
) -> Callable[[Any, Any, Any], AsyncIterator[Response]]:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: Any) -> AsyncIterator[Response]:
        try:
            async for item in method(self, request, context):
                yield item
        except errors.AgentError as e:
            await context.abort(status_for(e), str(e))
        except Exception as e:
            log.error("rpc_failed", exc=True, method=method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

    return wrapper


def watch_interval_seconds(interval_ms: int) -> float:
    if interval_ms == 0:
        return DEFAULT_WATCH_INTERVAL_MS / 1000
    if interval_ms < MIN_WATCH_INTERVAL_MS:
        raise errors.InvalidArgument(
            f"watch interval {interval_ms} ms is below the minimum {MIN_WATCH_INTERVAL_MS} ms"
        )
    return interval_ms / 1000


class MemoryAgentServicer(pb_grpc.MemoryAgentServicer):  # type: ignore[misc]
    def __init__(
        self,
        fs: KernelFS,
        stopping: asyncio.Event,
        swaps: SwapManager,
        hotplug: HotplugWatcher,
    ) -> None:
        self.fs = fs
        self._stopping = stopping
        self.swaps = swaps
        self.compactor = Compactor(fs)
        self.hotplug = hotplug
        self._page_size = os.sysconf("SC_PAGE_SIZE")

    @unary
    async def SetMemoryLimits(
        self, request: pb.SetMemoryLimitsRequest, context: Any
    ) -> pb.AppliedLimits:
        spec = memory_spec_from_pb(request.memory)
        applied = await asyncio.to_thread(
            apply_memory_limits, self.fs, request.cgroup, spec, request.create
        )
        return applied_limits_pb(applied)

    @unary
    async def Compact(self, request: pb.CompactRequest, context: Any) -> pb.CompactResult:
        node = request.node if request.HasField("node") else None
        remaining = context.time_remaining()
        # Answer just before the caller's deadline, so it hears why rather than a bare timeout.
        timeout = max(0.0, remaining - DEADLINE_MARGIN_SECONDS) if remaining is not None else None
        return compact_result_pb(await self.compactor.compact(node, timeout), self._page_size)

    @unary
    async def Reclaim(self, request: pb.ReclaimRequest, context: Any) -> pb.ReclaimResult:
        result = await asyncio.to_thread(
            reclaim, self.fs, request.cgroup, request.bytes, request.drop_caches
        )
        return reclaim_result_pb(result)

    @unary
    async def OnlineMemory(
        self, request: pb.OnlineMemoryRequest, context: Any
    ) -> pb.OnlineMemoryResult:
        return online_result_pb(await asyncio.to_thread(self.hotplug.online_now))

    @unary
    async def GetGuestOverhead(
        self, request: pb.GetGuestOverheadRequest, context: Any
    ) -> pb.GuestOverhead:
        return overhead_pb(guest_overhead(self.fs, tuple(request.workload_cgroups)))

    # Swap and limit changes block on the kernel (mkswap, swapon, reclaim on memory.max),
    # so they run in threads and never stall other calls or watch streams.

    @unary
    async def EnableSwap(self, request: pb.EnableSwapRequest, context: Any) -> pb.SwapArea:
        spec = enable_swap_spec_from_pb(request)
        return swap_area_pb(await asyncio.to_thread(self.swaps.enable, spec))

    @unary
    async def DisableSwap(self, request: pb.DisableSwapRequest, context: Any) -> pb.SwapArea:
        selector = selector_from_pb(request.device)
        return swap_area_pb(await asyncio.to_thread(self.swaps.disable, selector))

    @unary
    async def ListSwaps(self, request: pb.ListSwapsRequest, context: Any) -> pb.ListSwapsResponse:
        areas = await asyncio.to_thread(self.swaps.list)
        return pb.ListSwapsResponse(areas=[swap_area_pb(a) for a in areas])

    @unary
    async def GetMemoryInfo(self, request: pb.GetMemoryInfoRequest, context: Any) -> pb.MemoryInfo:
        return memory_info_pb(read_report(self.fs, tuple(request.cgroups)))

    @streaming
    async def WatchMemory(
        self, request: pb.WatchMemoryRequest, context: Any
    ) -> AsyncIterator[pb.MemoryInfo]:
        interval = watch_interval_seconds(request.interval_ms)
        names = tuple(request.cgroups)
        trigger = (
            pressure_trigger_spec(
                request.pressure_trigger.stall_us,
                request.pressure_trigger.window_us,
                request.pressure_trigger.full,
            )
            if request.HasField("pressure_trigger")
            else PressureTriggerSpec()
        )
        first = read_report(self.fs, names)
        events = {name: cgroup_dir(self.fs, name) / "memory.events" for name in names}
        with KernelSignals(events, self.fs.proc("pressure", "memory"), trigger) as signals:
            yield memory_info_pb(first, pb.WATCH_REASON_INITIAL)
            while True:
                woke = await self._next_signals(signals, interval)
                if woke is None:
                    return
                changed = tuple(sorted({name for kind, name in woke if name is not None}))
                if changed:
                    reason = pb.WATCH_REASON_MEMORY_EVENTS
                elif woke:
                    reason = pb.WATCH_REASON_PRESSURE
                else:
                    reason = pb.WATCH_REASON_INTERVAL
                yield memory_info_pb(read_report(self.fs, names), reason, changed)

    async def _next_signals(
        self, signals: KernelSignals, interval: float
    ) -> list[tuple[Signal, str | None]] | None:
        """Wait for kernel signals (coalesced) or the interval; None when the server stops."""
        getter = asyncio.ensure_future(signals.queue.get())
        stopper = asyncio.ensure_future(self._stopping.wait())
        try:
            done, _ = await asyncio.wait(
                {getter, stopper}, timeout=interval, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            getter.cancel()
            stopper.cancel()
        if stopper in done:
            return None
        if getter not in done:
            return []
        woke = [getter.result()]
        await asyncio.sleep(COALESCE_SECONDS)
        while not signals.queue.empty():
            woke.append(signals.queue.get_nowait())
        return woke


@dataclass
class ServerConfig:
    listen: tuple[Address, ...]
    fs: KernelFS = field(default_factory=KernelFS)
    allowed_cids: frozenset[int] = frozenset({2})
    grace_seconds: float = 10.0
    # How hot-plugged memory is onlined ("online", "online_movable"); None leaves it offline.
    online_memory: str | None = "online"


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
        pb_grpc.add_MemoryAgentServicer_to_server(
            MemoryAgentServicer(config.fs, self.stopping, SwapManager(config.fs), self.hotplug),
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
