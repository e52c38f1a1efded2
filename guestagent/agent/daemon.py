"""The daemon: listeners (unix, tcp, vsock through the relay), health, reflection, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import grpc

from guestagent import errors
from guestagent.agent import health, reflection
from guestagent.agent.audit import audit_kernel_switch
from guestagent.agent.first_call import ServiceOnFirstCall, recorded_handlers
from guestagent.agent.listen import (
    AddressInUse,
    open_unix_listener,
    open_vsock_listener,
    private_directory,
)
from guestagent.agent.on_first_use import OnFirstUse
from guestagent.agent.peers import NamedRelay, PeerTable, vsock_admitter
from guestagent.agent.threads import IdleExitPool
from guestagent.agent.undecodable import UndecodableRequests
from guestagent.jsonlog import EventLog
from guestagent.linux import statestore
from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.confidential import Confidential, decide, read_facts
from guestagent.linux.delayacct import DelayStallMeter
from guestagent.linux.kernel import Kernel
from guestagent.linux.syscalls import give_heap_back, nofile_limits, set_nofile_limits
from guestagent.ops import kernel_switches, limits_journal, swap_area
from guestagent.ops.hotplug import HotplugWatcher, OnlinePolicy
from guestagent.ops.idle import DEFAULT_AGING_INTERVAL_S, IdleAger
from guestagent.transport.address import (
    HOST_CID,
    Address,
    TcpAddress,
    UnixAddress,
    VsockAddress,
    grpc_target,
)
from guestagent.transport.relay import FDS_PER_CONNECTION, ConnectionBudget

if TYPE_CHECKING:
    from guestagent.ops.swap import SwapManager
    from guestagent.ops.workingset.reclaimer import Reclaimer
    from guestagent.ops.workingset.status import ReclaimOverview

log = EventLog("guestagent.daemon")

# The contract's service (protos/guestagent/v1/agent.proto), named here so that start-up need
# not load its descriptors: they load with its first call (agent/first_call.py).
SERVICE_NAME = "guestagent.v1.MemoryAgent"

DELAYACCT_SIGNAL = "delayacct"

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
BLOCKING_THREADS = 2
# The server's keepalive: ping a silent host every 2 min, drop it after 20 s unanswered;
# hosts may ping every 10 s.
KEEPALIVE_TIME_MS = 120_000
KEEPALIVE_TIMEOUT_MS = 20_000
MIN_CLIENT_PING_INTERVAL_MS = 10_000

# grpc-core cancels a call that waits over 30 s (its default) for the server to take it up.
# A slow or overcommitted guest can queue that long under load; the caller's own deadline,
# not a server-side timer it cannot see, should decide when to give up.
MAX_UNREQUESTED_SECONDS = 600
# Calls (unary or streams) the server runs at once; the surplus is RESOURCE_EXHAUSTED at once
# rather than queued without bound.
MAX_CONCURRENT_RPCS = 512
# Relayed connections held at once, unless the descriptor limit allows fewer
# (connection_cap); each costs FDS_PER_CONNECTION descriptors and some grpc memory.
DEFAULT_MAX_CONNECTIONS = 256
# Descriptors kept back for everything else: grpc's own, the gRPC server's end of each
# connection, state files, the inotify instance and PSI triggers, swap and sysfs files.
RESERVED_FDS = 128


@dataclass
class ServerConfig:
    listen: tuple[Address, ...]
    kernel: Kernel = field(default_factory=Kernel)
    allowed_cids: frozenset[int] = frozenset({HOST_CID})
    grace_seconds: float = 10.0
    # How hot-plugged memory is onlined; None leaves it offline.
    online_memory: OnlinePolicy | None = field(default_factory=OnlinePolicy)
    # Cgroups the working-set reclaimer starts on with the default policy, unless the host
    # already set theirs (kept under /run across restarts).
    reclaim: tuple[str, ...] = ()
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # linux/watch.py's DEFAULT_MAX_WATCHES, as the command line's default: that module loads
    # with the first WatchMemory, not at start.
    max_watches: int = 4096
    # --confidential: auto (what the kernel says), yes or no.
    confidential: str = "auto"
    # How often the one aging loop ages the multi-gen LRU (0: never; the idle figures absent).
    idle_aging_s: float = DEFAULT_AGING_INTERVAL_S
    # --delayacct, --mglru and --pcp-lists: turn each on (bound the lists) at start ("on")
    # or leave it as found ("keep").
    delayacct: str = kernel_switches.ON
    mglru: str = kernel_switches.ON
    pcp_lists: str = kernel_switches.ON
    # --stall-signal: "auto" (PSI where there is PSI, else delay accounting) or "delayacct".
    stall_signal: str = "auto"


class Agent:
    """A started server with its listeners; stop() drains it."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.stopping = asyncio.Event()
        self.peers = PeerTable()
        self.budget = ConnectionBudget(connection_cap(config.max_connections, nofile_limit()))
        self.server = grpc.aio.server(
            interceptors=[UndecodableRequests(self.peers)],
            maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.server_max_unrequested_time_in_server", MAX_UNREQUESTED_SECONDS),
                # Keepalive (docs/contract.md): a host that went away without closing (its
                # end of the vsock never said so) is pinged, and dropped with its streams'
                # watches when it does not answer; a host may ping as often as every 10 s,
                # with or without calls, to keep a long stream's connection alive.
                ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
                ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
                # grpc sets SO_REUSEPORT by default: a second agent would then share the
                # port and get half the calls. A taken port must fail the second start.
                ("grpc.so_reuseport", 0),
            ],
        )
        self.health = health.HealthService()
        # What health says for the agent and its service derives from these two.
        self._started = False
        self._contract_failed = False
        self._health_updates: set[asyncio.Task[None]] = set()
        self.relays: list[NamedRelay] = []
        self.bound: list[str] = []
        self._unix_paths: list[tuple[str, int]] = []
        self._private_dir: str | None = None
        self.hotplug = HotplugWatcher(config.kernel, config.online_memory)
        self.confidential = decide(config.confidential, read_facts(config.kernel))
        # Built at the first call that needs them, or below at start when an earlier agent
        # left them work; until then their modules stay unloaded.
        self.swaps = OnFirstUse(
            functools.partial(swap_manager, config.kernel, self.confidential), "swap"
        )
        # Delay accounting's stall where the guest has no PSI; a test tree has no tasks.
        self.stall = (
            DelayStallMeter(config.kernel, preferred=config.stall_signal == DELAYACCT_SIGNAL)
            if config.kernel.is_real
            else None
        )
        self.ager = IdleAger(config.kernel, config.idle_aging_s)
        self.reclaimer = OnFirstUse(
            functools.partial(
                started_reclaimer, config.kernel, self.stall, config.reclaim, self.ager
            ),
            "the reclaimer",
        )
        # Whether the reclaimer has work from start: --reclaim, or policies an earlier agent
        # left (the host's, kept across a restart). Read once: after this, only the reclaimer
        # itself writes that file, and SetReclaimPolicy builds it first.
        policies = statestore.state_file(config.kernel, statestore.RECLAIM_POLICIES)
        self._reclaimer_has_work = bool(config.reclaim) or policies.exists()
        # Health answers from start, without protobuf; the other two are built at their
        # first call.
        self.health.add_to(self.server)
        self.server.add_generic_rpc_handlers(
            [
                ServiceOnFirstCall(SERVICE_NAME, self._memory_agent_handlers),
                ServiceOnFirstCall(reflection.SERVICE_NAME, reflection_with_descriptors),
            ]
        )

    def _memory_agent_handlers(self) -> list[grpc.GenericRpcHandler]:
        """The contract's handlers, built at its first call. A build that fails (a module
        missing from the tree, a protobuf its generated code refuses) would have stopped an
        agent that loaded them at start; this one still answers health, so health says
        NOT_SERVING, for the agent and its service, until a later call's build succeeds
        (each call tries again; ServiceOnFirstCall logs why and refuses the call)."""
        try:
            handlers = self._build_memory_agent_handlers()
        except Exception:
            self._contract_failed = True
            self._publish_health_soon()
            raise
        if self._contract_failed:
            self._contract_failed = False
            self._publish_health_soon()
        return handlers

    def _publish_health_soon(self) -> None:
        # Called where grpc asks for a handler, on the event loop but not in a coroutine.
        task = asyncio.get_running_loop().create_task(self._publish_health())
        self._health_updates.add(task)  # Held until done: the loop keeps only a weak one.
        task.add_done_callback(self._health_updates.discard)

    async def _publish_health(self) -> None:
        """SERVING for the agent and its service once started, unless its contract failed to
        load at its last try; read as it is published, so updates in any order end right."""
        serving = self._started and not self._contract_failed
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health.SERVING if serving else health.NOT_SERVING)

    def reclaim_overview(self, cgroups: tuple[CgroupName, ...]) -> ReclaimOverview:
        """GetReclaimStatus. A reclaimer not built yet that has no work from start has no
        policy at all (SetReclaimPolicy builds it), so the answer is a new one's, without
        loading its modules (0.14 MiB on this host, 2026-12-06) for a host that only asks."""
        if self.reclaimer.built is None and not self._reclaimer_has_work:
            # Loaded with the contract's code already (agent/rpc.py), not at start.
            from guestagent.ops.workingset.status import overview_without_policies

            return overview_without_policies(cgroups)
        return self.reclaimer().overview(cgroups)

    def _build_memory_agent_handlers(self) -> list[grpc.GenericRpcHandler]:
        # With the wire conversions, the reports and the operations: the contract's code.
        from guestagent.agent.rpc import ENCODED_ANSWERS, MemoryAgentServicer
        from guestagent.v1 import agent_pb2_grpc

        servicer = MemoryAgentServicer(
            self.config.kernel,
            self.stopping,
            self.swaps,
            self.hotplug,
            self.reclaimer,
            self.reclaim_overview,
            self.peers,
            self.ager,
            self.stall,
            self.config.max_watches,
            confidential=self.confidential,
        )
        return recorded_handlers(
            lambda server: agent_pb2_grpc.add_MemoryAgentServicer_to_server(
                servicer, cast(grpc.aio.Server, server)
            ),
            ENCODED_ANSWERS,
        )

    async def start(self) -> None:
        # Every address is bound before anything starts, so a taken one leaves nothing behind.
        try:
            for address in self.config.listen:
                self._bind(address)
        except BaseException:
            self._release()
            raise
        # Not SERVING until state is loaded.
        await self.health.set("", health.NOT_SERVING)
        await self.server.start()
        for relay in self.relays:
            relay.start()
        if self.config.online_memory is not None and self.config.kernel.is_real:
            await self.hotplug.start()
        if swap_area.left_behind(self.config.kernel):
            await asyncio.to_thread(lambda: self.swaps().check_state())
        # Off unless the host (now or before a restart) or --reclaim turned it on.
        if self._reclaimer_has_work:
            await asyncio.to_thread(self.reclaimer)
        self.ager.start()
        self._started = True  # A first call may have come, and failed, meanwhile.
        await self._publish_health()
        give_heap_back()  # What start-up freed (the largest burst of all).
        log.info(
            "serving",
            listen=self.bound,
            allowed_cids=sorted(self.config.allowed_cids),
            max_connections=self.budget.limit,
            nofile=nofile_limit(),
            confidential=self.confidential.platform,
            confidential_evidence=self.confidential.evidence,
        )

    def _bind(self, address: Address) -> None:
        if isinstance(address, UnixAddress):
            # Through a relay, as vsock is: it reads the caller's uid with SO_PEERCRED for
            # the audit log. Mode 0600: only root in the guest may call, since a container
            # must not set its own limits.
            listener = open_unix_listener(address.path, 0o600)
            self._unix_paths.append((address.path, os.lstat(address.path).st_ino))
            self._relay(listener, f"unix-{os.path.basename(address.path)}")
            self.bound.append(f"unix://{address.path}")
        elif isinstance(address, TcpAddress):
            if tcp_port_in_use(address.host, address.port):
                raise AddressInUse(f"tcp://{grpc_target(address)}")
            port = self._add_port(grpc_target(address))
            if not address.is_loopback:
                log.warning("tcp_listen_not_loopback", host=address.host, port=port)
            self.bound.append(f"tcp://{grpc_target(TcpAddress(address.host, port))}")
        elif isinstance(address, VsockAddress):
            listener = open_vsock_listener(address)
            self._relay(listener, f"vsock-{address.port}", vsock_admitter(self.config.allowed_cids))
            self.bound.append(f"vsock://{listener.getsockname()[0]}:{address.port}")
        else:
            raise errors.InvalidArgument(f"cannot listen on {address}", "OPTION_INVALID")

    def _relay(
        self,
        listener: socket.socket,
        name: str,
        admit: Callable[[Any], bool] = lambda peer: True,
    ) -> None:
        upstream = self._private_socket()
        self.relays.append(
            NamedRelay(listener, upstream, self.peers, admit=admit, name=name, budget=self.budget)
        )

    def _add_port(self, target: str) -> int:
        try:
            port: int = self.server.add_insecure_port(target)
        except RuntimeError:
            port = 0  # grpcio raises where older versions returned 0; neither gives the errno.
        if port == 0:
            raise errors.FailedPrecondition(
                f"cannot bind {target} (grpc's log line says why)", "ADDRESS_UNAVAILABLE"
            )
        return port

    def _private_socket(self) -> str:
        """The unix socket relays dial: in a 0700 directory only this process can enter."""
        if self._private_dir is None:
            # Where mkdtemp would put it; a minimal guest root may have /run but no /tmp.
            temporary = os.environ.get("TMPDIR") or next(
                (d for d in ("/tmp", "/run") if os.path.isdir(d)), "/tmp"
            )
            self._private_dir = private_directory(temporary, "guestagent-")
            self._add_port(f"unix://{os.path.join(self._private_dir, 'grpc.sock')}")
        return os.path.join(self._private_dir, "grpc.sock")

    def _release(self) -> None:
        """Close relays and remove the sockets this agent created (not one that replaced ours)."""
        for relay in self.relays:
            relay.close()
        for path, inode in self._unix_paths:
            with contextlib.suppress(OSError):
                if os.lstat(path).st_ino == inode:
                    os.unlink(path)
        if self._private_dir is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self._private_dir, "grpc.sock"))
            with contextlib.suppress(OSError):
                os.rmdir(self._private_dir)

    async def stop(self) -> None:
        log.info("stopping", grace_seconds=self.config.grace_seconds)
        await self.health.enter_graceful_shutdown()
        for relay in self.relays:
            relay.close()
        # Ends WatchMemory streams; health's Watch streams ended once they said NOT_SERVING.
        # A stream left open would hold the server's stop below for the whole grace period.
        self.stopping.set()
        self.hotplug.stop()
        # Closed first: a call building it now is waited for, and none builds it after.
        reclaimer = await asyncio.to_thread(self.reclaimer.close)
        if reclaimer is not None:
            await asyncio.to_thread(reclaimer.stop)
        await asyncio.to_thread(self.ager.stop)
        await self.server.stop(self.config.grace_seconds)
        self._release()
        log.info("stopped")


def switch_kernel_features(config: ServerConfig) -> None:
    """Delay accounting and the multi-gen LRU on, the per-CPU free lists bounded, unless kept
    as found; logged and audited."""
    if not config.kernel.is_real:
        return
    for switch in (
        kernel_switches.switch_delayacct(config.kernel, config.delayacct),
        kernel_switches.switch_mglru(config.kernel, config.mglru),
        kernel_switches.switch_pcp_lists(config.kernel, config.pcp_lists),
    ):
        log.info(
            "kernel_setting",
            setting=switch.setting,
            before=switch.before,
            after=switch.after,
            left_because=switch.left_because or None,
        )
        if switch.changed or switch.left_because:
            audit_kernel_switch(switch.setting, switch.before, switch.after, switch.left_because)


def reflection_with_descriptors() -> list[grpc.GenericRpcHandler]:
    """Reflection over the agent's and the health service, with their descriptors loaded for
    it to find (neither service loads them before: see SERVICE_NAME and agent/health.py)."""
    from grpc_health.v1 import health_pb2  # noqa: F401

    from guestagent.v1 import agent_pb2  # noqa: F401

    return reflection.reflection_handlers((SERVICE_NAME, health.SERVICE_NAME))


def swap_manager(kernel: Kernel, confidential: Confidential) -> SwapManager:
    from guestagent.ops.swap import SwapManager  # With device-mapper, libudev, disk probes.

    return SwapManager(kernel, confidential=confidential)


def started_reclaimer(
    kernel: Kernel, stall: DelayStallMeter | None, initial: tuple[str, ...], ager: IdleAger
) -> Reclaimer:
    """The reclaimer with the host's saved policies reloaded and `initial` (--reclaim) on; it
    evicts what the ager's books call cold."""
    from guestagent.ops.workingset.reclaimer import Reclaimer

    reclaimer = Reclaimer(kernel, stall=stall, ages=lambda: ager.state)
    reclaimer.start(initial)
    return reclaimer


def tcp_port_in_use(host: str, port: int) -> bool:
    """Whether a listener holds host:port. Asked before grpc binds, because grpc neither
    says why a bind failed nor keeps its own log line about it off stderr."""
    if port == 0:
        return False
    try:
        resolved = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False  # grpc's own bind reports the bad name.
    for family, kind, proto, _, sockaddr in resolved:
        with socket.socket(family, kind, proto) as probe:
            # As grpc binds: SO_REUSEADDR, so only a listener (not TIME_WAIT) is in the way.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return True
    return False


def nofile_limit() -> int:
    return nofile_limits()[0]


def raise_nofile_limit() -> None:
    """The soft RLIMIT_NOFILE up to the hard one: systemd's soft default of 1024 ran out at 150
    idle connections, while the hard limit (the unit's LimitNOFILE=) is what the host allows."""
    soft, hard = nofile_limits()
    if soft != hard:
        set_nofile_limits(hard, hard)
        log.info("nofile_raised", soft=soft, to=hard)


def connection_cap(configured: int, nofile: int) -> int:
    """Connections the relays may hold: as configured, or fewer when the descriptors left after
    RESERVED_FDS would not cover them (with the gRPC server's end of each)."""
    return max(1, min(configured, (nofile - RESERVED_FDS) // (FDS_PER_CONNECTION + 1)))


async def serve(config: ServerConfig) -> None:
    """Run until SIGTERM or SIGINT, then stop accepting and let in-flight calls finish."""
    raise_nofile_limit()
    # Before anything reads its state: a directory that is not the agent's own is refused,
    # and the agent serves without persisting (GetMemoryInfo's state_unavailable says so).
    statestore.check_directory(config.kernel)
    # Before any listener: a limits change a dead agent left half done is rolled back
    # before a caller can see or change that cgroup.
    if limits_journal.left_behind(config.kernel):
        from guestagent.ops import limits  # Otherwise with SetMemoryLimits' first call.

        limits.recover(config.kernel)
    # Before the reclaimer reloads its policies: on a kernel without PSI they need one on.
    switch_kernel_features(config)
    # Blocking kernel work (mkswap, a memory.max write reclaiming, Compact) runs in threads;
    # asyncio's default pool grows to cpus + 4 under load, and each thread is paid for in
    # every guest. Two keep one slow write from holding up the others; they end when idle.
    asyncio.get_running_loop().set_default_executor(
        IdleExitPool(BLOCKING_THREADS, "blocking", after_burst=give_heap_back)
    )
    # Before the health service says SERVING: a SIGTERM right after must stop, not kill.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    agent = Agent(config)
    await agent.start()
    await stop.wait()
    await agent.stop()
