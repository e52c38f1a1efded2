"""One sandbox VM's loop in the node daemon: find its agent, see what it can do, turn on what
the node's policy asks, then follow its figure through the balloon (or, where the daemon may
not drive one, read its reports), until the VM goes or the daemon stops.

Its phases (`Phase`) and what it sets up from the agent's GetAgentInfo (`setup_plan`) are
pure; a failure anywhere is one log line and a wait that grows (`retry_delay`), never a
traceback or another VM's delay: each loop has its own thread and every call its deadline.
What the node's metrics read is a `GuestView`, replaced whole on each change.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import grpc

from guestagent.errors import AgentError
from guestagent.host.async_calls import AgentCalls, AsyncCalls
from guestagent.host.client import AgentTarget, WatchStream, channel_options, describe_error
from guestagent.host.giveback.follow import (
    GONE,
    BalloonKnob,
    Change,
    Follower,
    FollowOptions,
    Knob,
    Policy,
    Reading,
    stall_sample,
    stall_share,
)
from guestagent.host.node.config import Guest, NodePolicy
from guestagent.host.node.pressure import Headroom, HostMemory, headroom
from guestagent.host.node.sandboxes import AgentUrlError, Balloon, Sandbox
from guestagent.host.node.shim import ask_agent_address
from guestagent.host.streams import Reopening, Watchdog, quiet_limit
from guestagent.host.vmm.base import Vmm, VmmError
from guestagent.host.vmm.connect import open_vmm
from guestagent.jsonlog import EventLog
from guestagent.linux.cgroup.process_memory import CgroupMemoryUse, read_cgroup_memory
from guestagent.linux.fs import KernelFS
from guestagent.v1 import agent_pb2 as pb

log = EventLog("guestagent.node")

# Contract revision 4 finds the guest's workloads itself (SetReclaimPolicy.workloads).
WORKLOADS_REVISION = 4
RETRY_FIRST, RETRY_CAP = 1.0, 30.0
# A set-up step that failed with one of these did not happen for want of time or a
# connection, not because the guest refuses it: the round fails and is tried again, as a lost
# agent is (under a loaded host an EnableSwap or a SetReclaimPolicy can outlast its deadline,
# and a VM served without its reclaimer would never give back what it does not free itself).
TRANSIENT = frozenset(
    {
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
    }
)


class Phase(Enum):
    FINDING = "finding"  # Asking the shim where the agent is.
    CONNECTING = "connecting"  # Asking the agent what it can do.
    SERVING = "serving"  # Following its figure, or reading its reports.
    WAITING = "waiting"  # After a failure, before the next try.
    STOPPED = "stopped"  # The VM went, or the daemon stops.


def retry_delay(failures: int) -> float:
    """Seconds before the next try after `failures` in a row: 1, 2, 4 ... at most 30."""
    return min(RETRY_CAP, RETRY_FIRST * 2.0 ** max(0, failures - 1))


@dataclass(frozen=True)
class SetupPlan:
    """What the node turns on in one guest, and what it cannot, with why."""

    reclaim: bool
    swap: bool
    follow: bool
    missing: tuple[str, ...]  # What an older or reduced agent will not get here.


def setup_plan(info: pb.AgentInfo | None, sandbox: Sandbox, policy: NodePolicy) -> SetupPlan:
    """From the agent's GetAgentInfo (None: an agent before it, contract revision 1)."""
    revision = 1 if info is None else info.contract_revision
    version = "before GetAgentInfo" if info is None else info.version
    absent = {f.name: f.reason for f in info.features if not f.present} if info else {}
    missing = []
    reclaim = policy.guest.reclaim
    if reclaim and revision < WORKLOADS_REVISION:
        reclaim = False
        missing.append(
            f"the reclaimer: agent {version} (contract revision {revision}) cannot find its "
            f"workloads (revision {WORKLOADS_REVISION})"
        )
    elif reclaim and "psi" in absent and "delayacct" in absent:
        reclaim = False
        missing.append(
            f"the reclaimer: no stall signal (psi: {absent['psi']}; "
            f"delayacct: {absent['delayacct']})"
        )
    follow = policy.guest.follow and sandbox.balloon is Balloon.FOLLOW
    if follow and "idle_ages" in absent:
        missing.append(f"cold memory in the safe figure: {absent['idle_ages']}")
    return SetupPlan(reclaim, bool(policy.guest.swap_serial), follow, tuple(missing))


def reclaim_policy(guest: Guest) -> pb.ReclaimPolicy:
    """The reclaimer's policy for a guest's workloads: the agent's defaults but for anonymous
    memory, and the node's idle age for cold, so that what the reclaimer evicts as cold is what
    the give-back figure counts as cold (an agent before eviction by ages ignores the field)."""
    policy = pb.ReclaimPolicy(anon=guest.reclaim_anon)
    if guest.cold_after_ms:
        policy.cold_after_ms = guest.cold_after_ms
    return policy


@dataclass(frozen=True)
class GuestView:
    """What the node knows of one VM now: its metrics and its status line."""

    sandbox: Sandbox
    phase: Phase = Phase.FINDING
    reachable: bool = False
    agent_version: str = ""
    contract_revision: int = 0
    problem: str = ""
    failures: int = 0
    taken: int | None = None  # What the balloon holds; None without one followed.
    asked: int | None = None
    safe: int | None = None  # The most the balloon may hold by the figure, less headroom.
    stall: float | None = None
    cold: int | None = None  # The guest's cold memory, by the agent.
    mem_total: int | None = None
    headroom: Headroom | None = None
    vmm_cgroup: CgroupMemoryUse | None = None
    changes: tuple[tuple[str, str, int], ...] = ()  # (direction, cause, count)


class HeadroomKnob:
    """A balloon knob whose figure leaves the VM's headroom in the guest above the safe one
    (none while the host, or the VMM's cgroup, is short)."""

    def __init__(self, knob: Knob, room: Callable[[], Headroom]) -> None:
        self.knob, self.room = knob, room
        self.what = knob.what

    def read(self, info: pb.MemoryInfo) -> Reading:
        reading = self.knob.read(info)
        if reading.safe is None:
            return reading
        return replace(reading, safe=max(0, reading.safe - self.room().bytes))

    def asked(self) -> int:
        return self.knob.asked()

    def set(self, taken: int) -> None:
        self.knob.set(taken)


class Recording:
    """A WatchMemory stream whose reports are also handed to `seen`."""

    def __init__(self, stream: WatchStream, seen: Callable[[pb.MemoryInfo], None]) -> None:
        self.stream, self.seen = stream, seen

    def __iter__(self) -> Recording:
        return self

    def __next__(self) -> pb.MemoryInfo:
        report = next(self.stream)
        self.seen(report)
        return report

    def cancel(self) -> bool:
        return self.stream.cancel()


class GuestLoop:
    """One VM's loop, on a thread of its own (start(), stop())."""

    def __init__(
        self,
        sandbox: Sandbox,
        policy: NodePolicy,
        host: Callable[[], HostMemory],
        watchdog: Watchdog,
        streams: AsyncCalls,
        fs: KernelFS | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sandbox, self.policy, self.host, self.watchdog = sandbox, policy, host, watchdog
        self.streams = streams
        self.fs = fs or KernelFS()
        self.clock = clock
        self._view = GuestView(sandbox)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._follower: Follower | None = None
        self._reports: Reopening | None = None
        self._vmm_pid: int | None = None
        self._thread = threading.Thread(target=self.run, name=f"vm-{sandbox.id[:12]}", daemon=True)

    @property
    def view(self) -> GuestView:
        with self._lock:
            return self._view

    def _update(self, **changes: Any) -> None:
        with self._lock:
            self._view = replace(self._view, **changes)

    def _log(self, event: str, **fields: Any) -> None:
        log.info(event, vm=self.sandbox.id, source=self.sandbox.source, **fields)

    def start(self) -> GuestLoop:
        self._thread.start()
        return self

    def stop(self) -> None:
        """From another thread: the loop ends within a report or a retry's wait."""
        self._stopping.set()
        with self._lock:
            follower, reports = self._follower, self._reports
        if follower is not None:
            follower.stop()
        if reports is not None:
            reports.stop()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                served = self._serve_once()
                failures = 0 if served else failures + 1
            except (AgentUrlError, AgentError, VmmError, grpc.RpcError, OSError) as e:
                failures += 1
                problem = describe_error(e)
                self._update(problem=problem, failures=failures, reachable=False)
                log.warning(
                    "vm_unreachable",
                    vm=self.sandbox.id,
                    source=self.sandbox.source,
                    phase=self.view.phase.value,
                    error=problem,
                    failures=failures,
                )
            if self._stopping.is_set():
                break
            delay = retry_delay(failures) if failures else RETRY_FIRST
            self._update(phase=Phase.WAITING)
            self._stopping.wait(delay)
        self._update(phase=Phase.STOPPED, reachable=False)
        self._log("vm_loop_ended", note="its balloon is left where it is")

    def _address(self) -> str:
        if self.sandbox.agent is not None:
            return self.sandbox.agent
        assert self.sandbox.shim is not None  # A sandbox has one or the other.
        self._update(phase=Phase.FINDING)
        timeout = self.policy.timeouts.call_seconds
        discovery = self.policy.discovery
        return ask_agent_address(self.sandbox.shim, discovery.agent_port, timeout, discovery.root)

    def _serve_once(self) -> bool:
        """Find, connect, set up, serve; True when it served until stopped or gone."""
        address = self._address()
        self._update(phase=Phase.CONNECTING)
        timeout = self.policy.timeouts.call_seconds
        # Every call through the node's shared loop (host/async_calls.py), on one connection
        # an agent: the target only relays a vsock one.
        with AgentTarget(address, timeout) as reach, self._calls_of(reach) as agent:
            info = self._agent_info(agent)
            plan = setup_plan(info, self.sandbox, self.policy)
            self._update(
                reachable=True,
                problem="",
                agent_version="" if info is None else info.version,
                contract_revision=1 if info is None else info.contract_revision,
            )
            self._log(
                "vm_found",
                agent=address,
                vmm=self.sandbox.vmm.kind,
                balloon=self.sandbox.balloon.value,
                missing=list(plan.missing),
            )
            self._set_up(agent, plan)
            self._update(phase=Phase.SERVING)
            if plan.follow:
                return self._follow(agent)
            return self._read_reports(agent)

    @contextlib.contextmanager
    def _calls_of(self, reach: AgentTarget) -> Iterator[AgentCalls]:
        """The agent's calls on the shared loop; its channel closed with the target."""
        options = channel_options(self.policy.timeouts.call_seconds)
        try:
            yield self.streams.agent(reach.grpc_target, options, self.policy.timeouts.call_seconds)
        finally:
            self.streams.forget(reach.grpc_target)

    def _agent_info(self, agent: AgentCalls) -> pb.AgentInfo | None:
        try:
            return agent.agent_info()
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None  # An agent before GetAgentInfo.
            raise

    def _set_up(self, agent: AgentCalls, plan: SetupPlan) -> None:
        """Each step's refusal is logged and the others go on: a guest without a swap disk
        still gets its reclaimer."""
        guest = self.policy.guest
        if plan.swap:
            request = pb.EnableSwapRequest(device=pb.DeviceSelector(serial=guest.swap_serial))
            self._step("swap", lambda: agent.enable_swap(request).device)
        if plan.reclaim:
            policy = reclaim_policy(guest)
            self._step("reclaim", lambda: agent.set_workload_reclaim(True, policy).reason)

    def _step(self, what: str, call: Callable[[], str]) -> None:
        """A refusal is said once and the next step goes on; a transient failure ends the
        round (both steps are idempotent, so the next round asks again)."""
        try:
            self._log("vm_set_up", step=what, result=call())
        except grpc.RpcError as e:
            if e.code() in TRANSIENT:
                raise
            log.warning("vm_set_up_refused", vm=self.sandbox.id, step=what, error=describe_error(e))

    def _seen(self, report: pb.MemoryInfo) -> None:
        giveback = report.giveback
        self._update(
            reachable=True,
            cold=giveback.cold.bytes if giveback.HasField("cold") else None,
            mem_total=report.system.mem_total_bytes,
        )

    def _watch(self, agent: AgentCalls, interval_ms: int) -> Callable[[], WatchStream]:
        """The agent's stream, each report seen by the view first."""
        cold_after = self.policy.guest.cold_after_ms

        def watch() -> WatchStream:
            return Recording(agent.watch(interval_ms, cold_after), self._seen)

        return watch

    def _room(self) -> Headroom:
        """The VM's headroom now; a change is one decision line."""
        use = None
        if self._vmm_pid is not None:
            use = read_cgroup_memory(self.fs, self._vmm_pid)
        room = headroom(self.host(), use, self.policy.host)
        before = self.view.headroom
        self._update(headroom=room, vmm_cgroup=use)
        if before is None or (before.bytes, before.reason) != (room.bytes, room.reason):
            host = self.host()
            self._log(
                "vm_headroom",
                headroom_bytes=room.bytes,
                reason=room.reason,
                host_available_bytes=host.mem_available,
                host_psi_some_avg10=host.psi_some_avg10,
                vmm_cgroup=None if use is None else use.path,
                vmm_cgroup_current_bytes=None if use is None else use.current,
                vmm_cgroup_max_bytes=None if use is None else use.limit,
            )
        return room

    def _follow(self, agent: AgentCalls) -> bool:
        vmm = self._open_vmm()
        if vmm is None:
            return self._read_reports(agent)
        try:
            self._vmm_pid = vmm.pid
            guest = self.policy.guest
            knob = HeadroomKnob(BalloonKnob(vmm), self._room)
            policy = Policy(
                hold_seconds=guest.hold_seconds,
                stall_threshold=guest.stall_threshold,
                step=guest.step,
            )
            interval_ms = max(100, round(guest.interval_seconds * 1000))
            options = FollowOptions(
                json=True,
                gone_seconds=self.policy.timeouts.gone_seconds,
                quiet_seconds=quiet_limit(interval_ms),
            )
            follower = Follower(
                self._watch(agent, interval_ms),
                _Agent(agent, guest.cold_after_ms),
                vmm.name,
                knob,
                policy,
                options,
                metrics=_ViewMetrics(self),
                out=self._follow_line,
                watchdog=self.watchdog,
                err=lambda line: log.warning("vm_follow", vm=self.sandbox.id, detail=line),
            )
            with self._lock:
                self._follower = follower
            if self._stopping.is_set():
                return True
            return follower.run() != GONE
        finally:
            with self._lock:
                self._follower = None
            vmm.close()

    def _open_vmm(self) -> Vmm | None:
        """The VMM, with a balloon: None (and a line saying so) when it has none."""
        kind, api = self.sandbox.vmm.kind, self.sandbox.vmm.api
        assert api is not None  # Balloon.FOLLOW has an API socket.
        vmm = open_vmm(kind, api, self.policy.timeouts.call_seconds)
        try:
            vmm.balloon()
        except VmmError as e:
            vmm.close()
            self._log(
                "vm_no_balloon",
                vmm=kind,
                detail=str(e),
                note="free page reporting alone gives memory back",
            )
            return None
        return vmm

    def _follow_line(self, line: str) -> None:
        """The follow loop's JSON lines (inflate, deflate, gone ...) as the node's log."""
        fields = json.loads(line)
        event = fields.pop("event")
        self._log(f"vm_{event}", **fields)

    def _read_reports(self, agent: AgentCalls) -> bool:
        """A VM whose balloon the daemon may not drive: its reports only, for the metrics,
        until stopped, or the agent is silent for gone_seconds."""
        interval_ms = max(100, round(self.policy.guest.report_seconds * 1000))
        silent_since: list[float | None] = [None]
        gone = self.policy.timeouts.gone_seconds
        previous: list[Any] = [None]

        def broken(error: str, delay: float) -> None:
            now = self.clock()
            since = silent_since[0] if silent_since[0] is not None else now
            silent_since[0] = since
            self._update(reachable=False, problem=error)
            if now - since >= gone:
                reports.stop()

        reports = Reopening(self._watch(agent, interval_ms), broken, self.clock)
        with self._lock:
            self._reports = reports
        self.watchdog.guard(reports, quiet_limit(interval_ms))
        try:
            if self._stopping.is_set():
                return True
            for report in reports:
                silent_since[0] = None
                sample = stall_sample(report, self.clock())
                self._update(stall=stall_share(previous[0], sample))
                previous[0] = sample
        finally:
            self.watchdog.forget(reports)
            with self._lock:
                self._reports = None
        return silent_since[0] is None


class _Agent:
    """The agent as the follow loop asks it (giveback/oneshot.py's Agent): its report with the
    node's cold threshold, and a compaction."""

    def __init__(self, agent: AgentCalls, cold_after_ms: int) -> None:
        self.agent, self.cold_after_ms = agent, cold_after_ms

    def report(self) -> pb.MemoryInfo:
        return self.agent.report(self.cold_after_ms)

    def compact(self) -> pb.CompactResult:
        return self.agent.compact()


class _ViewMetrics:
    """The follow loop's observations, into the VM's view."""

    def __init__(self, loop: GuestLoop) -> None:
        self.loop = loop

    def observe(self, reading: Reading, asked: int, stall: float | None) -> None:
        self.loop._update(taken=reading.taken, asked=asked, safe=reading.safe, stall=stall)

    def changed(self, change: Change, direction: str) -> None:
        counts = {(d, c): n for d, c, n in self.loop.view.changes}
        key = (direction, change.cause)
        counts[key] = counts.get(key, 0) + 1
        self.loop._update(changes=tuple((d, c, n) for (d, c), n in sorted(counts.items())))
