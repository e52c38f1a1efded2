"""The MemoryAgent servicer: each RPC decodes (wire), calls an operation, and encodes (wire).

The decorators hold what every call shares: domain errors become status codes through one
table (STATUS_BY_ERROR), anything else is a bug, logged with its traceback before the
caller sees INTERNAL, and each state-changing call leaves one audit line.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, ParamSpec, TypeAlias, TypeVar

import grpc
from google.protobuf.message import Message

from guestagent import errors
from guestagent.agent import wire
from guestagent.agent.admission import ReportAdmission
from guestagent.agent.audit import audit
from guestagent.agent.peers import PeerTable
from guestagent.agent.shared_answers import SharedAnswers
from guestagent.agent.status import details_metadata
from guestagent.agent.threads import IdleExitPool
from guestagent.agent.watch_stream import WatchSpec, WatchUpdate, watch_memory
from guestagent.jsonlog import EventLog
from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.delayacct import DelayStallMeter
from guestagent.linux.device_selector import DeviceSelector
from guestagent.linux.kernel import Kernel
from guestagent.linux.syscalls import give_heap_back
from guestagent.linux.watch import DEFAULT_MAX_WATCHES, SignalHub
from guestagent.ops.agent_info import AgentInfo, agent_info
from guestagent.ops.compaction import Compactor, CompactResult
from guestagent.ops.hotplug import HotplugWatcher, OnlineResult
from guestagent.ops.idle import IdleAger
from guestagent.ops.info import InfoSpec, Report, Reporter
from guestagent.ops.limits import AppliedLimits, SetLimitsSpec, apply_memory_limits
from guestagent.ops.overhead import GuestOverhead, guest_overhead
from guestagent.ops.reclaim import ReclaimResult, ReclaimSpec, reclaim
from guestagent.ops.swap_area import EnableSwapSpec, SwapArea
from guestagent.ops.workingset.status import (
    ReclaimOverview,
    ReclaimPolicyRequest,
    TargetStatus,
    WorkloadReclaimRequest,
)
from guestagent.v1 import agent_pb2 as pb
from guestagent.v1 import agent_pb2_grpc as pb_grpc

log = EventLog("guestagent.rpc")

DEADLINE_MARGIN_SECONDS = 0.05

STATUS_BY_ERROR: dict[type[errors.AgentError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.KernelFormat: grpc.StatusCode.INTERNAL,
    errors.Internal: grpc.StatusCode.INTERNAL,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
}
# Threads that read kernel files for reports (GetMemoryInfo, watch streams, status), apart
# from the blocking writes' pool: a report of 1024 cgroups takes a while, and on the event
# loop's thread it held up every call, a health check included. Watch streams read on a
# thread of their own: 200 streams ticking together queued a GetMemoryInfo behind 200 reports.
READ_THREADS = 2
STREAM_READ_THREADS = 1
# Methods whose answers the servicer encodes itself (GetMemoryInfo's are shared:
# agent/shared_answers.py); their handlers send the bytes as they are (agent/first_call.py).
ENCODED_ANSWERS = frozenset({"GetMemoryInfo"})


async def run_on(
    pool: ThreadPoolExecutor,
    read: Callable[Params, Value],
    *args: Params.args,
    **kwargs: Params.kwargs,
) -> Value:
    call = functools.partial(read, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(pool, call)


def status_for(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The status code and details a caller sees for an exception out of an operation."""
    if isinstance(error, errors.AgentError):
        for cls in type(error).__mro__:
            if cls in STATUS_BY_ERROR:
                return STATUS_BY_ERROR[cls], str(error)
        return grpc.StatusCode.INTERNAL, str(error)
    return grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}"


Req = TypeVar("Req", bound=Message)
# What a unary decoder takes: the RPC's request or, for a decoder that serves several RPCs, a
# union. The generated base class still checks each method takes its own request type.
Decodable = TypeVar("Decodable", bound=Message)
# An answer, or its bytes where the servicer encodes it (ENCODED_ANSWERS).
Resp = TypeVar("Resp", bound=Message | bytes)
Spec = TypeVar("Spec")
Result = TypeVar("Result")
Params = ParamSpec("Params")
Value = TypeVar("Value")
if TYPE_CHECKING:  # grpc.aio.ServicerContext is generic only in its type stubs.
    Context: TypeAlias = grpc.aio.ServicerContext[Req, Resp]

    from guestagent.agent.on_first_use import OnFirstUse
    from guestagent.linux.confidential import Confidential
    from guestagent.ops.swap import SwapManager
    from guestagent.ops.workingset.reclaimer import Reclaimer


# What a state-changing call changed, from its request: the cgroups whose readings it changed
# (None: any reading) and whether the system's figures too (ops/info.py Reporter.changed).
Changes: TypeAlias = tuple[tuple[CgroupName, ...] | None, bool]


def anything(spec: object) -> Changes:
    return None, True


def unary(
    decode: Callable[[Decodable], Spec],
    encode: Callable[[Result], Resp],
    *,
    audited: bool = False,
    changes: Callable[[Spec], Changes] = anything,
) -> Callable[
    [Callable[[MemoryAgentServicer, Spec, Context[Req, Resp]], Awaitable[Result]]],
    Callable[[MemoryAgentServicer, Decodable, Context[Req, Resp]], Awaitable[Resp]],
]:
    """An RPC method from its operation: decode, call, encode, map errors, audit. An audited
    call changes state: reports after it take readings of what it `changes` afresh."""

    def decorate(
        call: Callable[[MemoryAgentServicer, Spec, Context[Req, Resp]], Awaitable[Result]],
    ) -> Callable[[MemoryAgentServicer, Decodable, Context[Req, Resp]], Awaitable[Resp]]:
        method = call.__name__

        @functools.wraps(call)
        async def rpc(
            self: MemoryAgentServicer, request: Decodable, context: Context[Req, Resp]
        ) -> Resp:
            started = time.monotonic()
            # Looked up first: a relayed caller's connection may be gone when the call ends.
            peer = self.peers.caller(context.peer()) if audited else ""
            code, details = grpc.StatusCode.OK, ""
            trailer: tuple[tuple[str, bytes], ...] = ()
            spec: Spec | None = None
            try:
                spec = decode(request)
                if not audited:
                    return encode(await call(self, spec, context))
                # A state-changing call: reports make room for it (agent/admission.py).
                async with self.admission.change():
                    return encode(await call(self, spec, context))
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception as e:
                code, details = status_for(e)
                trailer = details_metadata(code, details, e)
                if not isinstance(e, errors.AgentError):
                    log.error("rpc_failed", exc=True, method=method)
            finally:
                if audited and spec is not None:
                    # Reports after it read what it changed afresh, so its caller sees what
                    # it did (ops/info.py shares readings between calls).
                    self.reporter.changed(*changes(spec))
                if audited:
                    audit(method, peer, request, code, time.monotonic() - started, details)
            await context.abort(code, details, trailer)

        return rpc

    return decorate


def streaming(
    decode: Callable[[Req], Spec],
    encode: Callable[[Result], Resp],
) -> Callable[
    [Callable[[MemoryAgentServicer, Spec], AsyncIterator[Result]]],
    Callable[[MemoryAgentServicer, Req, Context[Req, Resp]], AsyncIterator[Resp]],
]:
    """A server-streaming RPC method from an async generator of domain values."""

    def decorate(
        call: Callable[[MemoryAgentServicer, Spec], AsyncIterator[Result]],
    ) -> Callable[[MemoryAgentServicer, Req, Context[Req, Resp]], AsyncIterator[Resp]]:
        @functools.wraps(call)
        async def rpc(
            self: MemoryAgentServicer, request: Req, context: Context[Req, Resp]
        ) -> AsyncIterator[Resp]:
            try:
                async for item in call(self, decode(request)):
                    yield encode(item)
            except Exception as e:
                code, details = status_for(e)
                if not isinstance(e, errors.AgentError):
                    log.error("rpc_failed", exc=True, method=call.__name__)
                await context.abort(code, details, details_metadata(code, details, e))

        return rpc

    return decorate


class MemoryAgentServicer(pb_grpc.MemoryAgentServicer):
    # Swap, limit and reclaim calls block on the kernel (mkswap, swapon, reclaim on
    # memory.max), so they run in threads and never stall other calls or watch streams.

    def __init__(
        self,
        kernel: Kernel,
        stopping: asyncio.Event,
        swaps: OnFirstUse[SwapManager],
        hotplug: HotplugWatcher,
        reclaimer: OnFirstUse[Reclaimer],
        reclaim_overview: Callable[[tuple[CgroupName, ...]], ReclaimOverview],
        peers: PeerTable,
        ager: IdleAger,
        stall: DelayStallMeter | None,
        max_watches: int = DEFAULT_MAX_WATCHES,
        *,
        confidential: Confidential,
    ) -> None:
        """The parts are the daemon's (agent/daemon.py wires them, once). Swap's manager and
        the reclaimer are built at their first call, each on the thread that serves it, so
        their modules load then; GetReclaimStatus asks `reclaim_overview`, which answers
        without building the reclaimer while it has no policy. `stall` is delay accounting's
        meter, read where the guest has no PSI; None reads PSI only. The ager is not started
        here: the daemon runs the one aging loop."""
        self.kernel = kernel
        self.stall = stall
        self.reclaimer = reclaimer
        self.reclaim_overview = reclaim_overview
        self.ager = ager
        self._stopping = stopping
        self.swaps = swaps
        self.compactor = Compactor(kernel)
        self.hotplug = hotplug
        self.peers = peers
        # One report for GetMemoryInfo and every stream (its hotplug section cached for all).
        self.reporter = Reporter(
            kernel,
            confidential=confidential,
            built_reclaimer=lambda: reclaimer.built,
            ager=ager,
            stall=stall,
        )
        self.signals = SignalHub(
            kernel, max_watches
        )  # Every stream's inotify watches and triggers.
        self.answers = SharedAnswers()
        self._readers = IdleExitPool(READ_THREADS, "read", after_burst=give_heap_back)
        self.admission = ReportAdmission(READ_THREADS)
        self._stream_readers = IdleExitPool(
            STREAM_READ_THREADS, "sread", after_burst=give_heap_back
        )

    async def _read(
        self, read: Callable[Params, Value], *args: Params.args, **kwargs: Params.kwargs
    ) -> Value:
        """Kernel reads on a reader thread, so the event loop answers other calls meanwhile."""
        return await run_on(self._readers, read, *args, **kwargs)

    async def _watch_report(
        self, spec: InfoSpec, removed_ok: bool, fresh_from: float | None
    ) -> Report:
        async with self.admission.report():
            return await run_on(
                self._stream_readers, self.reporter.report, spec, removed_ok, fresh_from
            )

    def _encoded_report(self, spec: InfoSpec, fresh_from: float) -> bytes:
        readings = self.reporter.readings(spec, False, fresh_from)
        return self.answers.answer(
            spec,
            readings,
            lambda: wire.report_pb(self.reporter.report_from(spec, readings)).SerializeToString(),
        )

    @unary(wire.no_arguments, wire.agent_info_pb)
    async def GetAgentInfo(
        self, _: None, context: Context[pb.GetAgentInfoRequest, pb.AgentInfo]
    ) -> AgentInfo:
        return await self._read(agent_info, self.kernel, self.stall, self.ager.state)

    @unary(wire.memory_info_from_pb, wire.as_is)
    async def GetMemoryInfo(  # type: ignore[override]  # Bytes for MemoryInfo: ENCODED_ANSWERS.
        self, spec: InfoSpec, context: Context[pb.GetMemoryInfoRequest, bytes]
    ) -> bytes:
        # As fresh as when it came, however long it waits for its turn; read and encoded on a
        # reader thread, so the loop that takes calls up stays free. Bytes: its handler has
        # no serializer (ENCODED_ANSWERS).
        fresh_from = self.reporter.fresh_from()
        async with self.admission.report():
            return await self._read(self._encoded_report, spec, fresh_from)

    @streaming(wire.watch_spec_from_pb, wire.watch_update_pb)
    def WatchMemory(self, spec: WatchSpec) -> AsyncIterator[WatchUpdate]:
        return watch_memory(
            self.kernel,
            spec,
            self._stopping,
            self._watch_report,
            hub=self.signals,
            stall=self.stall,
        )

    @unary(
        wire.reclaim_policy_request_from_pb,
        wire.reclaim_target_pb,
        audited=True,
        changes=lambda request: ((), False),  # The reclaimer's status is read live.
    )
    async def SetReclaimPolicy(
        self,
        request: ReclaimPolicyRequest | WorkloadReclaimRequest,
        context: Context[pb.SetReclaimPolicyRequest, pb.ReclaimTargetStatus],
    ) -> TargetStatus:
        return await asyncio.to_thread(lambda: self.reclaimer().set_policy(request))

    @unary(wire.cgroups_from_pb, wire.reclaim_status_pb)
    async def GetReclaimStatus(
        self,
        cgroups: tuple[CgroupName, ...],
        context: Context[pb.GetReclaimStatusRequest, pb.ReclaimStatus],
    ) -> ReclaimOverview:
        return await self._read(lambda: self.reclaim_overview(cgroups))

    @unary(wire.enable_swap_spec_from_pb, wire.swap_area_pb, audited=True)
    async def EnableSwap(
        self, spec: EnableSwapSpec, context: Context[pb.EnableSwapRequest, pb.SwapArea]
    ) -> SwapArea:
        return await asyncio.to_thread(lambda: self.swaps().enable(spec))

    @unary(wire.disable_swap_from_pb, wire.swap_area_pb, audited=True)
    async def DisableSwap(
        self, selector: DeviceSelector, context: Context[pb.DisableSwapRequest, pb.SwapArea]
    ) -> SwapArea:
        return await asyncio.to_thread(lambda: self.swaps().disable(selector))

    @unary(wire.no_arguments, wire.swap_list_pb)
    async def ListSwaps(
        self, _: None, context: Context[pb.ListSwapsRequest, pb.ListSwapsResponse]
    ) -> list[SwapArea]:
        return await asyncio.to_thread(lambda: self.swaps().list())

    @unary(
        wire.set_limits_spec_from_pb,
        wire.applied_limits_pb,
        audited=True,
        # Its cgroup's files; the system's give-back figures count protections (memory.low).
        changes=lambda spec: ((spec.cgroup,), spec.memory.reservation is not None),
    )
    async def SetMemoryLimits(
        self,
        spec: SetLimitsSpec,
        context: Context[pb.SetMemoryLimitsRequest, pb.AppliedLimits],
    ) -> AppliedLimits:
        return await asyncio.to_thread(apply_memory_limits, self.kernel, spec)

    @unary(wire.compact_node_from_pb, wire.compact_result_pb, audited=True)
    async def Compact(
        self, node: int | None, context: Context[pb.CompactRequest, pb.CompactResult]
    ) -> CompactResult:
        remaining = context.time_remaining()
        # Answer just before the caller's deadline, so it hears why rather than a bare timeout.
        timeout = max(0.0, remaining - DEADLINE_MARGIN_SECONDS) if remaining is not None else None
        return await self.compactor.compact(node, timeout)

    @unary(
        wire.reclaim_spec_from_pb,
        wire.reclaim_result_pb,
        audited=True,
        changes=lambda spec: ((spec.cgroup,), True),
    )
    async def Reclaim(
        self, spec: ReclaimSpec, context: Context[pb.ReclaimRequest, pb.ReclaimResult]
    ) -> ReclaimResult:
        return await asyncio.to_thread(reclaim, self.kernel, spec)

    @unary(wire.no_arguments, wire.online_result_pb, audited=True)
    async def OnlineMemory(
        self, _: None, context: Context[pb.OnlineMemoryRequest, pb.OnlineMemoryResult]
    ) -> OnlineResult:
        return await asyncio.to_thread(self.hotplug.online_now)

    @unary(wire.workloads_from_pb, wire.overhead_pb)
    async def GetGuestOverhead(
        self,
        workloads: tuple[CgroupName, ...],
        context: Context[pb.GetGuestOverheadRequest, pb.GuestOverhead],
    ) -> GuestOverhead:
        return await self._read(guest_overhead, self.kernel, workloads)
