"""Host-side client: reach the agent over vsock, hybrid vsock, unix or tcp.

grpcio cannot dial vsock either, so for vsock targets the client runs the relay in the
other direction: a private unix socket whose connections are joined to the guest.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from guestagent.host.refusal import refusal_of
from guestagent.transport.address import (
    HybridVsockAddress,
    UnixAddress,
    VsockAddress,
    grpc_target,
    parse_address,
)
from guestagent.transport.dial import dial_hybrid_vsock, dial_vsock
from guestagent.transport.relay import SocketRelay
from guestagent.v1 import agent_pb2 as pb
from guestagent.v1 import agent_pb2_grpc as pb_grpc


def channel_options(timeout: float) -> list[tuple[str, int]]:
    """grpc channel arguments for a client whose calls may take `timeout` seconds."""
    return [
        ("grpc.max_receive_message_length", 4 * 1024 * 1024),
        # The agent is local (a VM on this host): retry a refused connect within 100 ms, not
        # grpc's default 1 s, so a client that starts with the VM sees it ready at once.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        # grpc-core takes this as the shortest time one connection attempt may last (TCP or
        # unix connect up to the server's HTTP/2 SETTINGS frame), not only as a backoff. At
        # 100 ms an attempt was abandoned after the current backoff (100 ms, growing to at
        # most 1.2 s with jitter), so a guest too busy to send SETTINGS within that was never
        # reached. An attempt may now last as long as a call may.
        ("grpc.min_reconnect_backoff_ms", max(1, round(timeout * 1000))),
        # The contract's keepalive guidance for long streams: ping every 30 s (the agent
        # takes pings down to every 10 s), give up on the connection after 10 s unanswered.
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


class WatchStream(Protocol):
    """What WatchMemory returns: the reports as they come, and a way to end the stream."""

    def __iter__(self) -> Iterator[pb.MemoryInfo]: ...

    def __next__(self) -> pb.MemoryInfo: ...

    def cancel(self) -> bool: ...


RELAY_SOCKET = "relay.sock"


def private_directory() -> str:
    """A new directory only this user may enter, under $TMPDIR or /tmp, as tempfile.mkdtemp
    makes one (a random name, mode 0700, created, never reused), without tempfile: it
    brings shutil, random, bz2 and lzma into the node daemon."""
    parent = os.environ.get("TMPDIR") or "/tmp"
    while True:
        path = os.path.join(parent, f"guestctl-{os.urandom(6).hex()}")
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue


class AgentTarget:
    """What grpc dials to reach the agent at `target`: the agent itself (unix, tcp), or a
    private unix socket relayed to its vsock or hybrid vsock, which grpcio cannot dial; use as
    a context manager, which closes the relay. A failed dial is kept for the caller: grpc
    itself only sees the relay's socket closed ("recvmsg: Connection reset by peer")."""

    def __init__(self, target: str, timeout: float) -> None:
        self.target, self.timeout = target, timeout
        self._relay: SocketRelay | None = None
        self._relay_dir: str | None = None
        self.dial_failure: OSError | None = None
        address = parse_address(target)
        if isinstance(address, VsockAddress | HybridVsockAddress):
            address = self._start_relay(address)
        self.grpc_target = grpc_target(address)

    def _start_relay(self, address: VsockAddress | HybridVsockAddress) -> UnixAddress:
        self._relay_dir = private_directory()
        path = os.path.join(self._relay_dir, RELAY_SOCKET)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(16)
        dial = (
            functools.partial(dial_vsock, address, self.timeout)
            if isinstance(address, VsockAddress)
            else functools.partial(dial_hybrid_vsock, address, self.timeout)
        )
        self._relay = SocketRelay(
            listener, dial=dial, name="client-relay", on_dial_failed=self._dial_failed
        ).start()
        return UnixAddress(path)

    def _dial_failed(self, error: OSError) -> None:
        self.dial_failure = error

    def close(self) -> None:
        if self._relay is not None:
            self._relay.close()
        if self._relay_dir is not None:
            for remove, path in (
                (os.unlink, os.path.join(self._relay_dir, RELAY_SOCKET)),
                (os.rmdir, self._relay_dir),
            ):
                with contextlib.suppress(OSError):
                    remove(path)

    def __enter__(self) -> AgentTarget:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
        failure = self.dial_failure
        if failure is not None and isinstance(exc, grpc.RpcError) and _unavailable(exc):
            raise AgentUnreachable(str(failure)) from exc


class AgentClient:
    def __init__(self, target: str, timeout: float = 30.0) -> None:
        self.target = target
        self.timeout = timeout
        self._reach = AgentTarget(target, timeout)
        self.grpc_target = self._reach.grpc_target
        self.channel = grpc.insecure_channel(self.grpc_target, options=channel_options(timeout))
        self.stub = pb_grpc.MemoryAgentStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    def agent_info(self) -> pb.AgentInfo:
        return self.stub.GetAgentInfo(pb.GetAgentInfoRequest(), timeout=self.timeout)

    def info(
        self,
        cgroups: Iterable[str] = (),
        idle_edges_ms: Iterable[int] = (),
        cold_after_ms: int = 0,
    ) -> pb.MemoryInfo:
        request = pb.GetMemoryInfoRequest(
            cgroups=list(cgroups), idle_edges_ms=list(idle_edges_ms), cold_after_ms=cold_after_ms
        )
        return self.stub.GetMemoryInfo(request, timeout=self.timeout)

    def watch(
        self,
        cgroups: Iterable[str] = (),
        interval_ms: int = 0,
        trigger: pb.PressureTrigger | None = None,
        idle_edges_ms: Iterable[int] = (),
        cold_after_ms: int = 0,
    ) -> WatchStream:
        request = pb.WatchMemoryRequest(
            interval_ms=interval_ms,
            cgroups=list(cgroups),
            idle_edges_ms=list(idle_edges_ms),
            cold_after_ms=cold_after_ms,
        )
        if trigger is not None:
            request.pressure_trigger.CopyFrom(trigger)
        return self.stub.WatchMemory(request)

    def enable_swap(self, request: pb.EnableSwapRequest) -> pb.SwapArea:
        return self.stub.EnableSwap(request, timeout=self.timeout)

    def disable_swap(self, device: pb.DeviceSelector) -> pb.SwapArea:
        return self.stub.DisableSwap(pb.DisableSwapRequest(device=device), timeout=self.timeout)

    def list_swaps(self) -> list[pb.SwapArea]:
        response = self.stub.ListSwaps(pb.ListSwapsRequest(), timeout=self.timeout)
        return list(response.areas)

    def set_limits(
        self, cgroup: str, memory: pb.LinuxMemory, create: bool = False
    ) -> pb.AppliedLimits:
        request = pb.SetMemoryLimitsRequest(cgroup=cgroup, memory=memory, create=create)
        return self.stub.SetMemoryLimits(request, timeout=self.timeout)

    def compact(self, node: int | None = None) -> pb.CompactResult:
        request = pb.CompactRequest() if node is None else pb.CompactRequest(node=node)
        return self.stub.Compact(request, timeout=self.timeout)

    def reclaim(self, cgroup: str, bytes_: int, drop_caches: int = 0) -> pb.ReclaimResult:
        request = pb.ReclaimRequest(cgroup=cgroup, bytes=bytes_, drop_caches=drop_caches)
        return self.stub.Reclaim(request, timeout=self.timeout)

    def online_memory(self) -> pb.OnlineMemoryResult:
        return self.stub.OnlineMemory(pb.OnlineMemoryRequest(), timeout=self.timeout)

    def overhead(self, workload_cgroups: Iterable[str] = ()) -> pb.GuestOverhead:
        request = pb.GetGuestOverheadRequest(workload_cgroups=list(workload_cgroups))
        return self.stub.GetGuestOverhead(request, timeout=self.timeout)

    def set_reclaim_policy(
        self, cgroup: str, enabled: bool, policy: pb.ReclaimPolicy | None = None
    ) -> pb.ReclaimTargetStatus:
        request = pb.SetReclaimPolicyRequest(cgroup=cgroup, enabled=enabled, policy=policy)
        return self.stub.SetReclaimPolicy(request, timeout=self.timeout)

    def set_workload_reclaim(
        self, enabled: bool, policy: pb.ReclaimPolicy | None = None
    ) -> pb.ReclaimTargetStatus:
        """The reclaimer on (or off) for every cgroup the agent takes for a workload, now and
        as they come (contract revision 4)."""
        request = pb.SetReclaimPolicyRequest(workloads=True, enabled=enabled, policy=policy)
        return self.stub.SetReclaimPolicy(request, timeout=self.timeout)

    def reclaim_status(self, cgroups: Iterable[str] = ()) -> pb.ReclaimStatus:
        request = pb.GetReclaimStatusRequest(cgroups=list(cgroups))
        return self.stub.GetReclaimStatus(request, timeout=self.timeout)

    def health(self, service: str = "", timeout: float | None = None) -> str:
        response = self.health_stub.Check(
            health_pb2.HealthCheckRequest(service=service),
            timeout=self.timeout if timeout is None else timeout,
        )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))

    def wait_ready(self, timeout: float = 30.0) -> float:
        """Block until the health service says SERVING; returns the seconds it took."""
        start = time.monotonic()
        deadline = start + timeout
        while True:
            try:
                # A connection attempt may last a whole call: bound it by what is left here.
                if self.health(timeout=max(0.1, deadline - time.monotonic())) == "SERVING":
                    return time.monotonic() - start
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"agent at {self.target} not serving after {timeout:.0f} s")
            time.sleep(0.05)

    def close(self) -> None:
        self.channel.close()
        self._reach.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.channel.close()
        self._reach.__exit__(exc_type, exc, tb)


class AgentUnreachable(ConnectionError):
    """A call found no agent because the vsock or hybrid vsock dial failed; the message says
    which target and why (transport.dial.DialError's)."""


def _unavailable(error: grpc.RpcError) -> bool:
    code = getattr(error, "code", None)
    return callable(code) and code() == grpc.StatusCode.UNAVAILABLE


def describe_error(error: Any) -> str:
    """One line for a failed call, with the refusal's reason when it has one:
    'INVALID_ARGUMENT (CGROUP_PATH_INVALID): cgroup path ... is absolute'."""
    if isinstance(error, grpc.RpcError):
        reason = refusal_of(error).reason
        return f"{error.code().name}{f' ({reason})' if reason else ''}: {error.details()}"
    return str(error)
