"""The node's policy and its declared VMs, from TOML: every key known, typed and documented
(docs/node.md), its default safe; an unknown key or a wrong type is refused naming it, so a
typo never silently falls back to a default. Pure: text in, records out."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from guestagent.errors import AgentError
from guestagent.host.node.sandboxes import DECLARED, Balloon, Layout, Sandbox, Vmm
from guestagent.host.units import parse_size
from guestagent.host.vmm.connect import KINDS
from guestagent.sizes import MIB
from guestagent.transport.address import DEFAULT_VSOCK_PORT, TcpAddress, parse_address


class ConfigError(AgentError):
    """The node's policy or VM file is not one this daemon can run with; the text names the
    file, the key and the value."""


@dataclass(frozen=True)
class Discovery:
    # Prefixed to every path the runtimes use: a container sees the host's /run under it.
    root: str = "/"
    kata: bool = True  # /run/vc/sbs (the Go runtime) and /run/kata (runtime-rs)
    firecracker_containerd: bool = True
    shim_base: str = "/var/lib/firecracker-containerd/shim-base"
    declared: str = ""  # A file of VMs no runtime manages; "" for none.
    agent_port: int = DEFAULT_VSOCK_PORT
    # A full rescan this often besides inotify's wake-ups: a sandbox that appears or goes is
    # seen within it even where inotify says nothing (a directory made later).
    scan_seconds: float = 2.0

    @property
    def layout(self) -> Layout:
        return Layout(self.root, self.shim_base)


@dataclass(frozen=True)
class Guest:
    reclaim: bool = True  # The working-set reclaimer on the guest's workload cgroups.
    reclaim_anon: bool = False  # Anonymous memory too: only where the guest has swap.
    swap_serial: str = "swap0"  # Swap on the disk with this virtio serial, if any; "" none.
    follow: bool = True  # Keep a balloon the daemon may drive at the agent's safe figure.
    # firecracker-containerd's own API can resize a VM's balloon: follow it, or leave it.
    firecracker_containerd_balloon: str = Balloon.FOLLOW.value
    interval_seconds: float = 2.0  # The agent's report interval, for a followed balloon.
    # ... and for a VM whose balloon the daemon does not drive: its reports only feed the
    # metrics (a scrape every 15 s or so), and the agent still pushes its memory events.
    report_seconds: float = 15.0
    hold_seconds: float = 30.0  # How long the figure must allow more before taking it.
    stall_threshold: float = 0.10  # A stall share that lets memory out at once.
    step: int = 128 * MIB  # What a stall or a saturated guest gets back, doubling.
    cold_after_ms: int = 0  # 0: the agent's own (60 s).


@dataclass(frozen=True)
class Host:
    # Left in each guest beyond the safe figure while the host is not short, so a growing
    # guest does not wait for a deflate.
    headroom: int = 256 * MIB
    # The host is short when some task stalled on memory this share of the last 10 s
    # (/proc/pressure/memory's some avg10, in %) ...
    short_psi_some_avg10: float = 10.0
    # ... or MemAvailable is below this share of MemTotal.
    short_available: float = 0.10
    # A VMM in a host cgroup with a memory.max is kept this far under it.
    cgroup_margin: int = 256 * MIB


@dataclass(frozen=True)
class Metrics:
    listen: str = "127.0.0.1:9465"  # "" serves none.
    # CRI's socket, for pod names and namespaces (ListPodSandbox); "" names none.
    cri_socket: str = ""


@dataclass(frozen=True)
class Timeouts:
    call_seconds: float = 10.0  # One call to an agent, a shim or a VMM.
    # A VM whose agent or VMM has not answered this long is taken as gone: its loop ends
    # (discovery brings it back if it is still there).
    gone_seconds: float = 30.0


@dataclass(frozen=True)
class NodePolicy:
    discovery: Discovery = field(default_factory=Discovery)
    guest: Guest = field(default_factory=Guest)
    host: Host = field(default_factory=Host)
    metrics: Metrics = field(default_factory=Metrics)
    timeouts: Timeouts = field(default_factory=Timeouts)


def _size(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative")
        return value
    if isinstance(value, str):
        return parse_size(value)
    raise ValueError(f"{value!r} is not a size (bytes, or a string like '256Mi')")


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number of seconds")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{value!r}: seconds must be finite and above 0")
    return float(value)


def _share(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number")
    if not 0 <= value <= 1:
        raise ValueError(f"{value!r} is not within 0..1")
    return float(value)


def _percent(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
        raise ValueError(f"{value!r} is not a percentage within 0..100")
    return float(value)


def _count(value: Any) -> int:
    number: int = _exact(int)(value)
    if number < 0:
        raise ValueError(f"{number} is negative")
    return number


def _exact(kind: type) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            raise ValueError(f"{value!r} is not a {kind.__name__}")
        return value

    return check


def _port(value: Any) -> int:
    port: int = _exact(int)(value)
    if not 0 < port <= 0xFFFFFFFF:
        raise ValueError(f"{port} is not a vsock port")
    return port


def _choice(*allowed: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in allowed:
            raise ValueError(f"{value!r} is not one of {', '.join(allowed)}")
        return str(value)

    return check


def _listen(value: Any) -> str:
    text: str = _exact(str)(value)
    try:
        tcp = not text or isinstance(parse_address(f"tcp://{text}"), TcpAddress)
    except AgentError as e:
        raise ValueError(f"{text!r} is not HOST:PORT: {e}") from None
    if not tcp:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return text


# How each key is read, by section; a key not here is refused.
READERS: dict[str, dict[str, Callable[[Any], Any]]] = {
    "discovery": {
        "root": _exact(str),
        "kata": _exact(bool),
        "firecracker_containerd": _exact(bool),
        "shim_base": _exact(str),
        "declared": _exact(str),
        "agent_port": _port,
        "scan_seconds": _seconds,
    },
    "guest": {
        "reclaim": _exact(bool),
        "reclaim_anon": _exact(bool),
        "swap_serial": _exact(str),
        "follow": _exact(bool),
        "firecracker_containerd_balloon": _choice(Balloon.FOLLOW.value, Balloon.LEAVE.value),
        "interval_seconds": _seconds,
        "report_seconds": _seconds,
        "hold_seconds": _seconds,
        "stall_threshold": _share,
        "step": _size,
        "cold_after_ms": _count,
    },
    "host": {
        "headroom": _size,
        "short_psi_some_avg10": _percent,
        "short_available": _share,
        "cgroup_margin": _size,
    },
    "metrics": {"listen": _listen, "cri_socket": _exact(str)},
    "timeouts": {"call_seconds": _seconds, "gone_seconds": _seconds},
}
SECTIONS: dict[str, type] = {
    "discovery": Discovery,
    "guest": Guest,
    "host": Host,
    "metrics": Metrics,
    "timeouts": Timeouts,
}


def _read_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not TOML: {e}") from None


def _section(name: str, table: Any, where: str) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [{name}] is not a table")
    readers = READERS[name]
    values = {}
    for key, value in table.items():
        if key not in readers:
            known = ", ".join(readers)
            raise ConfigError(f"{where}: [{name}] has no key {key!r} (it has: {known})")
        try:
            values[key] = readers[key](value)
        except ValueError as e:
            raise ConfigError(f"{where}: [{name}] {key}: {e}") from None
    return SECTIONS[name](**values)


def parse_policy(text: str, where: str = "the node policy") -> NodePolicy:
    document = _read_toml(text, where)
    unknown = sorted(set(document) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{where}: no section {unknown[0]!r} (it has: {', '.join(SECTIONS)})")
    return NodePolicy(**{name: _section(name, document[name], where) for name in document})


DECLARED_KEYS = {"id", "agent", "vmm", "api", "balloon"}


def parse_declared(text: str, where: str) -> tuple[Sandbox, ...]:
    """The VMs of a declared file: `[[vm]]` tables with `id` and `agent` (an address:
    vsock://CID:PORT, hvsock:///path:PORT, unix:///path, tcp://HOST:PORT), and optionally
    `vmm` and `api` (its API socket) and `balloon` ("follow", the default with an API, or
    "leave")."""
    document = _read_toml(text, where)
    unknown = sorted(set(document) - {"vm"})
    if unknown:
        raise ConfigError(f"{where}: no key {unknown[0]!r}: VMs are [[vm]] tables")
    tables = document.get("vm", [])
    if not isinstance(tables, list):
        raise ConfigError(f"{where}: vm is not a list of [[vm]] tables")
    seen: set[str] = set()
    sandboxes = []
    for number, table in enumerate(tables, 1):
        sandbox = _declared_vm(table, f"{where}: vm {number}")
        if sandbox.id in seen:
            raise ConfigError(f"{where}: vm {number}: id {sandbox.id!r} is declared twice")
        seen.add(sandbox.id)
        sandboxes.append(sandbox)
    return tuple(sandboxes)


def _declared_vm(table: Any, where: str) -> Sandbox:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: not a table")
    unknown = sorted(set(table) - DECLARED_KEYS)
    if unknown:
        raise ConfigError(f"{where}: no key {unknown[0]!r} (it has: {', '.join(DECLARED_KEYS)})")
    for key in ("id", "agent"):
        if not isinstance(table.get(key), str) or not table[key]:
            raise ConfigError(f"{where}: {key} must be a non-empty string")
    try:
        parse_address(table["agent"])
    except AgentError as e:
        raise ConfigError(f"{where}: agent: {e}") from None
    kind, api = table.get("vmm", ""), table.get("api")
    if kind and kind not in KINDS:
        raise ConfigError(f"{where}: vmm {kind!r} is not one of {', '.join(KINDS)}")
    if (api is None) != (not kind) or (api is not None and not isinstance(api, str)):
        raise ConfigError(f"{where}: vmm and api go together (the API socket's path)")
    balloon = table.get("balloon", Balloon.FOLLOW.value if api else Balloon.NONE.value)
    allowed = (Balloon.FOLLOW.value, Balloon.LEAVE.value) if api else (Balloon.NONE.value,)
    if balloon not in allowed:
        raise ConfigError(f"{where}: balloon {balloon!r} is not one of {', '.join(allowed)}")
    return Sandbox(table["id"], DECLARED, table["agent"], None, Vmm(kind, api), Balloon(balloon))
