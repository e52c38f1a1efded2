"""The MemoryAgent servicer: each RPC validates, calls an operation, and encodes the answer.

Domain errors become status codes in one table (STATUS_BY_ERROR); everything else is a bug
and is logged with its traceback before the caller sees INTERNAL.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from guestagent import errors
from guestagent.agent.wire import (
    applied_limits_pb,
    compact_result_pb,
    enable_swap_spec_from_pb,
    memory_info_pb,
    memory_spec_from_pb,
    online_result_pb,
    overhead_pb,
    reclaim_policy_from_pb,
    reclaim_result_pb,
    reclaim_status_pb,
    reclaim_target_pb,
    selector_from_pb,
    swap_area_pb,
)
from guestagent.jsonlog import EventLog
from guestagent.linux.cgroups import cgroup_dir
from guestagent.linux.fs import KernelFS
from guestagent.linux.meminfo import read_report
from guestagent.linux.watch import KernelSignals, PressureTriggerSpec, Signal, pressure_trigger_spec
from guestagent.ops.compaction import Compactor
from guestagent.ops.hotplug import HotplugWatcher
from guestagent.ops.limits import apply_memory_limits
from guestagent.ops.overhead import guest_overhead
from guestagent.ops.reclaim import reclaim
from guestagent.ops.reclaimer import Reclaimer
from guestagent.ops.swap import SwapManager
from guestagent.v1 import agent_pb2 as pb
from guestagent.v1 import agent_pb2_grpc as pb_grpc

log = EventLog("guestagent.rpc")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["MemoryAgent"].full_name
DEFAULT_WATCH_INTERVAL_MS = 1000
MIN_WATCH_INTERVAL_MS = 100
# Signals that arrive within this long of each other are sent as one message.
COALESCE_SECONDS = 0.01
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
        reclaimer: Reclaimer | None = None,
    ) -> None:
        self.fs = fs
        self.reclaimer = reclaimer or Reclaimer(fs)
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
        names = tuple(request.cgroups)
        return self._with_reclaim(memory_info_pb(read_report(self.fs, names)), names)

    def _with_reclaim(self, message: pb.MemoryInfo, names: tuple[str, ...]) -> pb.MemoryInfo:
        """Add the reclaimer's status for those of the cgroups it acts on."""
        message.reclaim.extend(reclaim_target_pb(s) for s in self.reclaimer.known(names))
        return message

    @unary
    async def SetReclaimPolicy(
        self, request: pb.SetReclaimPolicyRequest, context: Any
    ) -> pb.ReclaimTargetStatus:
        policy = reclaim_policy_from_pb(request.policy)
        status = await asyncio.to_thread(
            self.reclaimer.set_policy, request.cgroup, request.enabled, policy
        )
        return reclaim_target_pb(status)

    @unary
    async def GetReclaimStatus(
        self, request: pb.GetReclaimStatusRequest, context: Any
    ) -> pb.ReclaimStatus:
        targets = self.reclaimer.status(tuple(request.cgroups))
        return reclaim_status_pb(targets, self.reclaimer.compaction)

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
            yield self._with_reclaim(memory_info_pb(first, pb.WATCH_REASON_INITIAL), names)
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
                report = read_report(self.fs, names)
                yield self._with_reclaim(memory_info_pb(report, reason, changed), names)

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
