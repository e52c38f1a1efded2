"""The node daemon: discovery hands it the sandboxes it finds, it keeps one loop per VM
(started within a scan of the VM appearing, stopped and its series gone within a scan of it
going), reads the host's memory once a second for every loop, names pods from the CRI, and
serves one Prometheus endpoint. SIGTERM stops every loop and leaves each balloon where it is,
and says so."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc

from guestagent.host.async_calls import AsyncCalls
from guestagent.host.metrics.families import Family
from guestagent.host.node.config import NodePolicy
from guestagent.host.node.cri import PodNames
from guestagent.host.node.discovery import Finder, Found, scanning
from guestagent.host.node.guest import GuestLoop, GuestView
from guestagent.host.node.metrics import node_families
from guestagent.host.node.pressure import HostMemory, host_short, read_host
from guestagent.host.node.sandboxes import Balloon
from guestagent.host.streams import Watchdog
from guestagent.jsonlog import EventLog
from guestagent.linux.fs import KernelFS

log = EventLog("guestagent.node")
Families = Callable[[], list[Family]]
# Serves the families it is given; returns how to stop serving them.
ServeMetrics = Callable[[Families], Callable[[], None]]
HOST_READ_SECONDS = 1.0  # Every loop reads the host's memory through one cached read.
CRI_SECONDS = 5.0  # Unnamed sandboxes are asked of the CRI this often (kata-monitor's).
STOP_SECONDS = 10.0  # How long SIGTERM waits for the loops to end.


class HostReading:
    """The host's memory, read at most once a HOST_READ_SECONDS whoever asks."""

    def __init__(self, fs: KernelFS, clock: Callable[[], float] = time.monotonic) -> None:
        self.fs, self.clock = fs, clock
        self._lock = threading.Lock()
        self._read_at = -HOST_READ_SECONDS
        self._host: HostMemory | None = None

    def __call__(self) -> HostMemory:
        with self._lock:
            now = self.clock()
            if self._host is None or now - self._read_at >= HOST_READ_SECONDS:
                self._host, self._read_at = read_host(self.fs), now
            return self._host


class NodeDaemon:
    def __init__(self, policy: NodePolicy, fs: KernelFS | None = None) -> None:
        self.policy = policy
        self.fs = fs or KernelFS()
        follow_fc = policy.guest.firecracker_containerd_balloon == Balloon.FOLLOW.value
        self.finder = Finder(policy.discovery, follow_fc)
        self.host = HostReading(self.fs)
        self.watchdog = Watchdog()
        self.streams = AsyncCalls()
        self.loops: dict[str, GuestLoop] = {}
        self._lock = threading.Lock()
        self._said: set[str] = set()  # Discovery problems already logged.
        self.stopping = threading.Event()
        cri = policy.metrics.cri_socket
        self.pods = PodNames(cri, policy.timeouts.call_seconds) if cri else None

    def found(self, found: Found) -> None:
        """A scan's sandboxes: loops for new ones (or ones whose record changed), none for
        those gone."""
        with self._lock:
            ending = [
                (sandbox_id, loop)
                for sandbox_id, loop in self.loops.items()
                if found.sandboxes.get(sandbox_id) != loop.sandbox
            ]
            for sandbox_id, _ in ending:
                del self.loops[sandbox_id]
            starting = [s for i, s in found.sandboxes.items() if i not in self.loops]
            for sandbox in starting:
                if not self.stopping.is_set():
                    loop = GuestLoop(
                        sandbox, self.policy, self.host, self.watchdog, self.streams, self.fs
                    )
                    self.loops[sandbox.id] = loop.start()
        for sandbox_id, loop in ending:
            loop.stop()
            log.info(
                "vm_dropped",
                vm=sandbox_id,
                source=loop.sandbox.source,
                note="its loop ends; its series go; its balloon is left where it is",
            )
        for sandbox in starting:
            log.info(
                "vm_discovered",
                vm=sandbox.id,
                source=sandbox.source,
                agent=sandbox.agent,
                shim=sandbox.shim,
                vmm=sandbox.vmm.kind,
                vmm_api=sandbox.vmm.api,
                balloon=sandbox.balloon.value,
            )
        for problem in found.problems:
            if problem not in self._said:
                self._said.add(problem)
                log.warning("discovery_problem", problem=problem)

    def views(self) -> list[GuestView]:
        with self._lock:
            loops = list(self.loops.values())
        return [loop.view for loop in loops]

    def families(self) -> list[Family]:
        views = self.views()
        pods = self.pods.names if self.pods is not None else {}
        try:
            host: HostMemory | None = self.host()
        except OSError:
            host = None
        short = None if host is None else host_short(host, self.policy.host)
        return node_families(views, pods, host, short)

    def _name_pods(self) -> None:
        assert self.pods is not None
        failing = False
        while not self.stopping.wait(CRI_SECONDS):
            with self._lock:
                wanted = list(self.loops)
            try:
                self.pods.refresh(wanted)
                failing = False
            except grpc.RpcError as e:
                if not failing:  # Once per outage: the names wait, the series do not.
                    log.warning("cri_unreachable", error=str(e.details()))
                failing = True

    def run(self, serve_metrics: ServeMetrics) -> int:
        """Until `stopping` is set (the command sets it on SIGTERM or SIGINT). `serve_metrics`
        serves the families and returns how to stop it (the command passes
        prometheus_client's; tests, their own)."""
        stop_metrics = serve_metrics(self.families)
        threads = [
            threading.Thread(
                target=scanning,
                args=(
                    self.finder,
                    self.found,
                    self.stopping.is_set,
                    self.policy.discovery.scan_seconds,
                ),
                name="discovery",
                daemon=True,
            ),
        ]
        if self.pods is not None:
            threads.append(threading.Thread(target=self._name_pods, name="cri", daemon=True))
        for thread in threads:
            thread.start()
        log.info(
            "node_started",
            **{"scanning": self.finder.roots(), "declared": self.policy.discovery.declared or None},
        )
        try:
            self.stopping.wait()
        finally:
            self.stop()
            stop_metrics()
        return 0

    def stop(self) -> None:
        """Every loop stopped, each balloon left where it is."""
        self.stopping.set()
        with self._lock:
            loops = list(self.loops.values())
            self.loops.clear()
        for loop in loops:
            loop.stop()
        deadline = time.monotonic() + STOP_SECONDS
        for loop in loops:
            loop.join(max(0.0, deadline - time.monotonic()))
        self.watchdog.stop()
        self.streams.stop()
        if self.pods is not None:
            self.pods.close()
        log.info("node_stopped", vms=len(loops), note="every balloon is left where it is")
