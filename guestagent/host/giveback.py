"""`guestctl give-back`: take from a guest what its agent says it can give, through QEMU.

The agent's report (MemoryInfo.giveback) says how far a balloon or a virtio-mem device can
go without reaching into the guest's working set. This asks for it, compacts the guest first
(so the pages given up lie together, as Apple's Virtualization framework asks before it
drives a balloon), sets QEMU's balloon or a virtio-mem device's requested-size over QMP,
waits until QEMU reports the device settled, and says what changed: the guest's figures and
QEMU's RSS before and after. The decisions are pure functions over plain values; QMP, the
agent and /proc sit in `give_back` and `QemuMonitor`.

Sizes are in QEMU's terms, as `--to` takes them: for the balloon, the guest's RAM size less
the balloon (query-balloon's `actual`); for virtio-mem, the device's requested-size. The
agent's safe balloon target is a MemTotal, which the balloon lowers as it inflates (QEMU's
default, deflate-on-oom off), so it is turned into a balloon value by the balloon's offset.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from google.protobuf.json_format import MessageToDict
from qemu.qmp import QMPClient, QMPError

from guestagent.host.client import AgentClient
from guestagent.host.display import mib
from guestagent.linux.fs import KernelFS
from guestagent.linux.mm import jit_code_rss_bytes, parse_smaps, rss_bytes
from guestagent.v1 import agent_pb2 as pb

BALLOON, VIRTIO_MEM = "balloon", "virtio-mem"
BALLOON_PAGE = 4096  # virtio-balloon's page, whatever the guest's (VIRTIO_BALLOON_PFN_SHIFT).
# How long QEMU's figure must hold still, short of the target, to count as settled: a balloon
# inflating into a guest that must swap to make room moves in bursts, and in a TCG guest on a
# busy host one pause lasted over 15 s before it went on.
STILL_SECONDS = 30.0
POLL_SECONDS = 0.5


class GiveBackError(Exception):
    """The command cannot go on (no figure, no such device, QEMU never settled): exit 1."""


class Refused(Exception):
    """A size below the safe figure, or none to check it against, without --force: exit 2."""


@dataclass(frozen=True)
class VirtioMemDevice:
    """A virtio-mem device as QEMU's query-memory-devices reports it."""

    id: str
    memaddr: int
    block_size: int
    max_size: int
    size: int
    requested_size: int


@dataclass(frozen=True)
class Step:
    """What give-back asks of QEMU, all in the device's own terms (see the module's doc)."""

    via: str
    device: str  # "balloon", or the virtio-mem device's QEMU id
    current: int  # The balloon's actual or the device's plugged size, before.
    value: int  # What QEMU is asked for.
    safe: int | None  # The agent's safe figure in the same terms; None without one.
    reason: str  # The agent's reason for it.
    forced: bool = False


def round_up(size: int, block: int) -> int:
    return -(-size // block) * block


def balloon_value(guest_bytes: int, mem_total: int, actual: int) -> int:
    """The balloon value that leaves the guest a MemTotal of guest_bytes: the balloon holds
    (RAM - actual) already and MemTotal is already without it, so it inflates by the rest.
    Rounded up to the balloon's 4 KiB page: QEMU rounds down, and an actual that can never
    equal the value would read as a balloon that stopped short."""
    return round_up(actual - (mem_total - guest_bytes), BALLOON_PAGE)


def check_size(
    asked: int, safe: int | None, reason: str, force: bool, what: str
) -> tuple[int, bool]:
    """(asked, forced): refuse a size below the safe figure, or with no figure to check it
    against, unless forced."""
    if safe is not None and asked >= safe:
        return asked, False
    if not force:
        if safe is None:
            raise Refused(
                f"--to {asked} ({mib(asked)}) cannot be checked: the agent reports no {what} "
                f"({reason}); nothing changed (--force to go ahead)"
            )
        raise Refused(
            f"--to {asked} ({mib(asked)}) is below the safe {what} {safe} ({mib(safe)}): "
            f"{reason}; nothing changed (--force to go ahead)"
        )
    return asked, True


def plan_balloon(
    info: pb.MemoryInfo, actual: int, ram_size: int, to: int | None, force: bool
) -> Step:
    """The balloon step: --safe (to None) takes the agent's safe_balloon_target, --to a
    balloon value; never above the guest's RAM (QEMU caps it there too)."""
    giveback = info.giveback
    safe: int | None = None
    reason = "the agent reports no give-back figures (an agent older than this guestctl?)"
    if info.HasField("giveback") and giveback.HasField("safe_balloon_target"):
        figure = giveback.safe_balloon_target
        safe = min(ram_size, balloon_value(figure.bytes, info.system.mem_total_bytes, actual))
        reason = figure.reason
    if to is None:
        if safe is None:
            raise GiveBackError(f"--safe: {reason}")
        return Step(BALLOON, BALLOON, actual, safe, safe, reason)
    asked = min(round_up(to, BALLOON_PAGE), ram_size)
    value, forced = check_size(asked, safe, reason, force, "balloon size")
    return Step(BALLOON, BALLOON, actual, value, safe, reason, forced)


def pick_virtio_mem(devices: Sequence[VirtioMemDevice], wanted: str | None) -> VirtioMemDevice:
    """The device named, or the only one."""
    if wanted is not None:
        for device in devices:
            if device.id == wanted:
                return device
        known = ", ".join(d.id for d in devices) or "none"
        raise GiveBackError(f"no virtio-mem device {wanted!r} in QEMU (it has: {known})")
    if len(devices) != 1:
        known = ", ".join(d.id for d in devices) or "none"
        raise GiveBackError(f"name a virtio-mem device with --device (QEMU has: {known})")
    return devices[0]


def safe_requested_size(info: pb.MemoryInfo, device: VirtioMemDevice) -> pb.Figure | None:
    """The agent's figure for the device: the guest names it (virtio4), QEMU by its id; the
    region's start address is what both know."""
    names = [r.device for r in info.hotplug.virtio_mem if r.start_address == device.memaddr]
    for target in info.giveback.virtio_mem:
        if target.device in names and target.HasField("safe_requested_size"):
            return target.safe_requested_size
    return None


def plan_virtio_mem(
    info: pb.MemoryInfo, device: VirtioMemDevice, to: int | None, force: bool
) -> Step:
    """The virtio-mem step, rounded up to the device's block (QEMU takes only whole blocks,
    and rounding up never goes below a figure)."""
    figure = safe_requested_size(info, device)
    # The guest counts whole memory blocks added; QEMU's size may be less (a block partly
    # plugged): asking for more than QEMU has would plug memory, not give it back.
    safe = None if figure is None else min(round_up(figure.bytes, device.block_size), device.size)
    reason = (
        figure.reason
        if figure is not None
        else f"the agent reports no safe requested size for the device at {device.memaddr:#x}"
    )
    if to is None:
        if safe is None:
            raise GiveBackError(f"--safe: {reason}")
        return Step(VIRTIO_MEM, device.id, device.size, safe, safe, reason)
    asked = round_up(to, device.block_size)
    if asked > device.max_size:
        raise Refused(f"--to {asked} ({mib(asked)}) is above {device.id}'s {mib(device.max_size)}")
    value, forced = check_size(asked, safe, reason, force, "requested size")
    return Step(VIRTIO_MEM, device.id, device.size, value, safe, reason, forced)


def settled(samples: Sequence[tuple[float, int]], target: int, still_seconds: float) -> str | None:
    """ "reached" once QEMU's figure is the target, "stopped" once it has not moved for
    still_seconds short of it (the guest gave what it could); None while it moves."""
    if not samples:
        return None
    now, last = samples[-1]
    if last == target:
        return "reached"
    since = now
    for seen, value in reversed(samples):
        if value != last:
            break
        since = seen
    return "stopped" if now - since >= still_seconds else None


class Agent(Protocol):
    """What give-back asks of the agent."""

    def report(self) -> pb.MemoryInfo: ...

    def compact(self) -> pb.CompactResult: ...


@dataclass(frozen=True)
class ClientAgent:
    """The agent through guestctl's client, its report asked with the cold threshold."""

    client: AgentClient
    cold_after_ms: int

    def report(self) -> pb.MemoryInfo:
        request = pb.GetMemoryInfoRequest(cold_after_ms=self.cold_after_ms)
        info: pb.MemoryInfo = self.client.stub.GetMemoryInfo(request, timeout=self.client.timeout)
        return info

    def compact(self) -> pb.CompactResult:
        return self.client.compact()


class Monitor(Protocol):
    """What give-back asks of QEMU."""

    pid: int

    def cmd(self, name: str, **args: Any) -> Any: ...


class QemuMonitor:
    """A QMP connection to QEMU (qemu.qmp: the vm extra), and the pid of the QEMU at its
    other end, from the unix socket's peer credentials."""

    def __init__(self, path: str, timeout: float) -> None:
        self.timeout = timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            sock.close()
            raise
        self.pid: int = struct.unpack("3i", creds)[0]
        self._loop = asyncio.new_event_loop()
        self._client = QMPClient("guestctl")
        try:
            # A monitor already in use by another client accepts but never greets.
            self._run(self._client.connect(sock), f"QMP greeting on {path}")
        except BaseException:
            sock.close()
            self._loop.close()
            raise

    def _run(self, work: Any, what: str) -> Any:
        try:
            return self._loop.run_until_complete(asyncio.wait_for(work, self.timeout))
        except TimeoutError:
            raise GiveBackError(f"no answer from QEMU within {self.timeout:g} s: {what}") from None
        except QMPError as e:
            raise GiveBackError(f"QMP {what}: {e}") from None

    def cmd(self, name: str, **args: Any) -> Any:
        return self._run(self._client.execute(name, args), name)

    def close(self) -> None:
        self._run(self._client.disconnect(), "disconnect")
        self._loop.close()


@dataclass(frozen=True)
class Options:
    via: str
    to: int | None  # None: --safe
    force: bool
    dry_run: bool
    device: str | None
    settle_timeout: float
    still_seconds: float = STILL_SECONDS


def qemu_rss(pid: int) -> dict[str, int]:
    """QEMU's VmRSS and, of it, TCG's translated code (0 under KVM): that buffer grows as
    the guest runs new code whatever the guest holds, so what was given back is measured
    without it."""
    fs = KernelFS()
    return {
        "qemu_rss_bytes": rss_bytes(fs.read(fs.proc(str(pid), "status"))),
        "qemu_tcg_code_rss_bytes": jit_code_rss_bytes(
            parse_smaps(fs.read(fs.proc(str(pid), "smaps")))
        ),
    }


def guest_rss(side: dict[str, Any]) -> int:
    """QEMU's RSS less TCG's translated code: the guest's memory and QEMU's own."""
    return int(side["qemu_rss_bytes"]) - int(side.get("qemu_tcg_code_rss_bytes", 0))


def virtio_mem_devices(monitor: Monitor) -> list[VirtioMemDevice]:
    return [
        VirtioMemDevice(
            id=d["data"]["id"],
            memaddr=d["data"]["memaddr"],
            block_size=d["data"]["block-size"],
            max_size=d["data"]["max-size"],
            size=d["data"]["size"],
            requested_size=d["data"]["requested-size"],
        )
        for d in monitor.cmd("query-memory-devices")
        if d["type"] == "virtio-mem"
    ]


def plan(info: pb.MemoryInfo, monitor: Monitor, options: Options) -> Step:
    if options.via == BALLOON:
        summary = monitor.cmd("query-memory-size-summary")
        ram_size = summary["base-memory"] + summary.get("plugged-memory", 0)
        actual = monitor.cmd("query-balloon")["actual"]
        return plan_balloon(info, actual, ram_size, options.to, options.force)
    device = pick_virtio_mem(virtio_mem_devices(monitor), options.device)
    return plan_virtio_mem(info, device, options.to, options.force)


def device_size(monitor: Monitor, step: Step) -> int:
    """QEMU's figure for the step's device: the balloon's actual, or virtio-mem's size."""
    if step.via == BALLOON:
        return int(monitor.cmd("query-balloon")["actual"])
    path = f"/machine/peripheral/{step.device}"
    return int(monitor.cmd("qom-get", path=path, property="size"))


class StillMoving(GiveBackError):
    """The device had not settled by the timeout; `reached` is where it stood."""

    def __init__(self, message: str, reached: int) -> None:
        super().__init__(message)
        self.reached = reached


def apply(monitor: Monitor, step: Step) -> None:
    if step.via == BALLOON:
        monitor.cmd("balloon", value=step.value)
    else:
        path = f"/machine/peripheral/{step.device}"
        monitor.cmd("qom-set", path=path, property="requested-size", value=step.value)


def wait_settled(
    monitor: Monitor,
    step: Step,
    options: Options,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, float, int]:
    """(how it settled, seconds, QEMU's figure then); GiveBackError past the timeout."""
    started = clock()
    samples: list[tuple[float, int]] = []
    while True:
        samples.append((clock() - started, device_size(monitor, step)))
        outcome = settled(samples, step.value, options.still_seconds)
        if outcome is not None:
            return outcome, samples[-1][0], samples[-1][1]
        if samples[-1][0] > options.settle_timeout:
            raise StillMoving(
                f"{step.device} still moving after {options.settle_timeout:g} s: at "
                f"{mib(samples[-1][1])}, asked {mib(step.value)}",
                samples[-1][1],
            )
        sleep(POLL_SECONDS)


def figures(info: pb.MemoryInfo) -> dict[str, Any]:
    """The report's give-back section and MemTotal, for the before and after."""
    return {
        "mem_total_bytes": info.system.mem_total_bytes,
        "giveback": MessageToDict(info.giveback, preserving_proto_field_name=True),
    }


def give_back(agent: Agent, monitor: Monitor, options: Options, pid: int | None) -> dict[str, Any]:
    """The whole command; returns what it did. Refused and GiveBackError change nothing but
    what they say; past the settle timeout QEMU is left asking for where the device stood."""
    qemu_pid = pid if pid is not None else monitor.pid
    info = agent.report()
    step = plan(info, monitor, options)
    result: dict[str, Any] = {
        "step": asdict(step),
        "qemu_pid": qemu_pid,
        "dry_run": options.dry_run,
        "before": {**figures(info), **qemu_rss(qemu_pid)},
    }
    if options.dry_run:
        return result
    result["compact"] = MessageToDict(agent.compact(), preserving_proto_field_name=True)
    apply(monitor, step)
    try:
        outcome, seconds, reached = wait_settled(monitor, step, options)
    except StillMoving as e:
        # As for a device that stopped short (below): left asking, the guest keeps pressing.
        apply(monitor, replace(step, value=e.reached))
        raise GiveBackError(f"{e}; QEMU now asks for {mib(e.reached)}, where it stood") from None
    if outcome == "stopped":
        # Left asking for more, the guest's driver keeps pressing: the balloon retries its
        # allocations every 200 ms and virtio-mem its unplugs, which pushed a guest here into
        # its hot set (seen: the hot loop 1.78x slower after). What it gave is what it can.
        apply(monitor, replace(step, value=reached))
    result["settled"] = {"how": outcome, "seconds": round(seconds, 1), "device_bytes": reached}
    result["after"] = {**figures(agent.report()), **qemu_rss(qemu_pid)}
    return result


def _figure_text(name: str, figure: dict[str, Any]) -> str:
    return f"  {name} {mib(int(figure.get('bytes', 0)))}: {figure.get('reason', '')}"


def _guest_text(side: dict[str, Any]) -> list[str]:
    giveback = side["giveback"]
    lines = [f"  MemTotal {mib(side['mem_total_bytes'])}"]
    for name in ("free_reportable", "free_fragmented", "cold", "safe_balloon_target"):
        if name in giveback:
            lines.append(_figure_text(name, giveback[name]))
    for target in giveback.get("virtio_mem", []):
        figure = target.get("safe_requested_size", {})
        lines.append(_figure_text(f"{target['device']} safe_requested_size", figure))
    return lines


def _rss_text(side: dict[str, Any]) -> str:
    code = int(side.get("qemu_tcg_code_rss_bytes", 0))
    text = mib(int(side["qemu_rss_bytes"]))
    return f"{text} ({mib(guest_rss(side))} without TCG's translated code)" if code else text


def result_text(result: dict[str, Any]) -> str:
    step = result["step"]
    what = "balloon" if step["via"] == BALLOON else f"virtio-mem {step['device']} requested-size"
    safe = "none reported" if step["safe"] is None else mib(step["safe"])
    forced = " (--force: below the safe figure)" if step["forced"] else ""
    lines = [
        f"{what}: {mib(step['current'])} -> {mib(step['value'])}{forced}; safe {safe}",
        "guest before:",
        *_guest_text(result["before"]),
        f"QEMU (pid {result['qemu_pid']}) RSS before {_rss_text(result['before'])}",
    ]
    if result["dry_run"]:
        return "\n".join([*lines, "dry run: nothing compacted, nothing asked of QEMU"])
    compact = result["compact"]
    settled_ = result["settled"]
    short = settled_["how"] == "stopped"
    lines += [
        f"compacted: free in 2 MiB blocks {mib(int(compact.get('free_huge_bytes_before', 0)))}"
        f" -> {mib(int(compact.get('free_huge_bytes_after', 0)))}",
        f"{step['device']} {settled_['how']} at {mib(settled_['device_bytes'])} after "
        f"{settled_['seconds']} s"
        + ("; asked for that instead, so the guest is not pressed further" if short else ""),
        "guest after:",
        *_guest_text(result["after"]),
        f"QEMU RSS after {_rss_text(result['after'])} "
        f"({mib(guest_rss(result['before']) - guest_rss(result['after']))} given back)",
    ]
    return "\n".join(lines)


def result_json(result: dict[str, Any]) -> str:
    return json.dumps(result, indent=2)
