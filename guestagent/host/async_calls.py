"""Many agents' calls on one asyncio loop, on a thread of its own, each called as if blocking:
what the node daemon's loops use. grpc's blocking API waits for a stream's next message in
0.1 s slices (grpc/_common.py, MAXIMUM_WAIT_TIMEOUT), and keeps a thread spinning per channel
with a stream open: a node daemon's fifty idle streams cost 2.5 % of a core and a hundred
threads that way (docs/measurements.md, the node daemon). An asyncio stream waits for its
next message without waking, and hands it to a queue the reader blocks on; a unary call is
awaited on the loop and its answer handed back. One channel a target: one connection to each
agent, not one for the calls and one for the stream."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Sequence
from typing import Any, cast

import grpc
from grpc import aio

from guestagent.host.client import WatchStream
from guestagent.v1 import agent_pb2 as pb
from guestagent.v1 import agent_pb2_grpc as pb_grpc

_END = object()  # The agent ended the stream.


def _cancelled() -> aio.AioRpcError:
    return aio.AioRpcError(grpc.StatusCode.CANCELLED, details="the stream was cancelled")


class AsyncCalls:
    """The loop, and one aio channel per target (a VM's agent, or its client's relay)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._channels: dict[str, aio.Channel] = {}
        self._thread = threading.Thread(target=self._loop.run_forever, name="streams", daemon=True)
        self._thread.start()

    def stream(
        self, target: str, options: Sequence[tuple[str, int]], request: pb.WatchMemoryRequest
    ) -> WatchStream:
        return _QueuedStream(self, target, options, request)

    def agent(self, target: str, options: Sequence[tuple[str, int]], timeout: float) -> AgentCalls:
        return AgentCalls(self, target, options, timeout)

    def unary(
        self,
        target: str,
        options: Sequence[tuple[str, int]],
        method: str,
        request: Any,
        timeout: float,
    ) -> Any:
        """The agent's answer to one call (`method` of MemoryAgentStub), or its RpcError."""

        async def call() -> Any:
            stub = pb_grpc.MemoryAgentStub(self._channel(target, options))
            return await getattr(stub, method)(request, timeout=timeout)

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result()

    def _channel(self, target: str, options: Sequence[tuple[str, int]]) -> aio.Channel:
        """In the loop's thread: the target's channel, made on first use."""
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = aio.insecure_channel(target, options=options)
        return channel

    def forget(self, target: str) -> None:
        """Close the target's channel (its VM went): its streams end, cancelled."""

        async def close() -> None:
            channel = self._channels.pop(target, None)
            if channel is not None:
                await channel.close()

        with contextlib.suppress(RuntimeError):  # The loop is stopped already.
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)

    def stop(self) -> None:
        async def close_all() -> None:
            for channel in self._channels.values():
                await channel.close()
            self._channels.clear()

        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(close_all(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class AgentCalls:
    """One agent's calls on the shared loop, as the node's loops make them."""

    def __init__(
        self, owner: AsyncCalls, target: str, options: Sequence[tuple[str, int]], timeout: float
    ) -> None:
        self.owner, self.target, self.options, self.timeout = owner, target, options, timeout

    def _call(self, method: str, request: Any) -> Any:
        return self.owner.unary(self.target, self.options, method, request, self.timeout)

    def agent_info(self) -> pb.AgentInfo:
        return cast(pb.AgentInfo, self._call("GetAgentInfo", pb.GetAgentInfoRequest()))

    def info(self, cold_after_ms: int = 0) -> pb.MemoryInfo:
        request = pb.GetMemoryInfoRequest(cold_after_ms=cold_after_ms)
        return cast(pb.MemoryInfo, self._call("GetMemoryInfo", request))

    def compact(self) -> pb.CompactResult:
        return cast(pb.CompactResult, self._call("Compact", pb.CompactRequest()))

    def enable_swap(self, request: pb.EnableSwapRequest) -> pb.SwapArea:
        return cast(pb.SwapArea, self._call("EnableSwap", request))

    def set_workload_reclaim(
        self, enabled: bool, policy: pb.ReclaimPolicy | None = None
    ) -> pb.ReclaimTargetStatus:
        request = pb.SetReclaimPolicyRequest(workloads=True, enabled=enabled, policy=policy)
        return cast(pb.ReclaimTargetStatus, self._call("SetReclaimPolicy", request))

    def watch(self, interval_ms: int, cold_after_ms: int) -> WatchStream:
        request = pb.WatchMemoryRequest(interval_ms=interval_ms, cold_after_ms=cold_after_ms)
        return self.owner.stream(self.target, self.options, request)

    def report(self, cold_after_ms: int) -> pb.MemoryInfo:
        return self.info(cold_after_ms)


class _QueuedStream:
    """One WatchMemory call, pumped by the loop into a queue its reader blocks on."""

    def __init__(
        self,
        owner: AsyncCalls,
        target: str,
        options: Sequence[tuple[str, int]],
        request: pb.WatchMemoryRequest,
    ) -> None:
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._call: aio.UnaryStreamCall[pb.WatchMemoryRequest, pb.MemoryInfo] | None = None
        self._cancelled = False
        self._lock = threading.Lock()
        self._owner = owner
        asyncio.run_coroutine_threadsafe(self._pump(target, options, request), owner._loop)

    async def _pump(
        self, target: str, options: Sequence[tuple[str, int]], request: pb.WatchMemoryRequest
    ) -> None:
        try:
            stub = pb_grpc.MemoryAgentStub(self._owner._channel(target, options))
            call = stub.WatchMemory(request)
            with self._lock:
                self._call = call
                cancelled = self._cancelled
            if cancelled:
                call.cancel()
            async for message in call:
                self._queue.put(message)
            self._queue.put(_END)
        except aio.AioRpcError as e:
            self._queue.put(e)
        except asyncio.CancelledError:
            self._queue.put(_cancelled())

    def __iter__(self) -> _QueuedStream:
        return self

    def __next__(self) -> pb.MemoryInfo:
        item = self._queue.get()
        if item is _END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return cast(pb.MemoryInfo, item)

    def cancel(self) -> bool:
        with self._lock:
            self._cancelled = True
            call = self._call
        if call is not None:
            self._owner._loop.call_soon_threadsafe(call.cancel)
        return True
