"""`guestctl give-back`: take what the agent says is safe through the VMM, once (`--safe`,
`--to`) or as the figure moves (`--follow`)."""

from __future__ import annotations

import argparse
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING

import grpc

from guestagent.errors import AgentError
from guestagent.host.client import AgentClient, WatchStream, describe_error
from guestagent.host.commands.common import (
    Command,
    UsageError,
    cold_after_argument,
    json_or_text,
    listen_address,
    missing_extra,
    need_target,
    seconds,
    share,
    size,
)
from guestagent.host.streams import Watchdog, quiet_limit
from guestagent.host.units import SIZE_HELP
from guestagent.host.vmm.connect import KINDS

if TYPE_CHECKING:
    from guestagent.host.giveback.oneshot import Agent
    from guestagent.host.vmm.base import Vmm


def _give_back_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vmm",
        choices=KINDS,
        default="qemu",
        help="whose API --qmp or --api is (default qemu)",
    )
    api = parser.add_mutually_exclusive_group(required=True)
    api.add_argument("--qmp", help="QEMU's QMP unix socket (--vmm qemu)")
    api.add_argument(
        "--api",
        metavar="SOCKET",
        help="the VMM's API unix socket (Cloud Hypervisor's --api-socket, Firecracker's "
        "--api-sock; for QEMU, its QMP socket)",
    )
    how_far = parser.add_mutually_exclusive_group()
    how_far.add_argument(
        "--to",
        type=size,
        help="the balloon's size in the VMM's terms (QEMU: the guest's RAM less the balloon; "
        "Cloud Hypervisor, Firecracker: what the balloon takes) or the virtio-mem "
        f"requested size: {SIZE_HELP}",
    )
    how_far.add_argument("--safe", action="store_true", help="the agent's safe figure")
    how_far.add_argument(
        "--follow",
        action="store_true",
        help="keep the device at the agent's safe figure as it moves, until SIGTERM",
    )
    parser.add_argument(
        "--via",
        choices=["balloon", "virtio-mem"],
        default="balloon",
        help="the device that gives memory back (default balloon)",
    )
    parser.add_argument("--device", help="the virtio-mem device's id (default: the only one)")
    parser.add_argument("--force", action="store_true", help="go past the safe figure")
    parser.add_argument("--dry-run", action="store_true", help="say what it would do, do nothing")
    parser.add_argument("--pid", type=int, help="the VMM's pid for its RSS (default: the peer)")
    cold_after_argument(parser)
    parser.add_argument(
        "--settle-timeout",
        type=seconds,
        default=600.0,
        metavar="SECONDS",
        help="how long the device may take to reach its size (default 600)",
    )
    follow = parser.add_argument_group("--follow")
    follow.add_argument(
        "--interval", type=seconds, default=2.0, metavar="S", help="the agent's report interval"
    )
    follow.add_argument(
        "--hold",
        type=seconds,
        default=30.0,
        metavar="S",
        help="how long the figure must allow more before the device takes it",
    )
    follow.add_argument(
        "--stall-threshold",
        type=share,
        default=0.10,
        metavar="SHARE",
        help="give back at once when some task stalled on memory this share of the interval",
    )
    follow.add_argument(
        "--step",
        type=size,
        default=128 << 20,
        help="what to give back on a stall or when the guest needs all it has (doubling, "
        "twice at most, while it goes on)",
    )
    follow.add_argument(
        "--metrics", type=listen_address, metavar="HOST:PORT", help="serve Prometheus metrics here"
    )
    follow.add_argument(
        "--gone-after",
        type=seconds,
        default=30.0,
        metavar="S",
        help="end, exit 3, once the agent or the VMM has not answered this long (default 30)",
    )


def _give_back(args: argparse.Namespace) -> int:
    """Exit 0 when done (or a dry run, or a follow loop stopped), 2 on a refused size or bad
    flags, 1 when a call fails, 3 when a follow loop's agent or VMM is gone."""
    if not (args.to is not None or args.safe or args.follow):
        raise UsageError("give-back needs one of --to, --safe, --follow")
    if args.qmp is not None and args.vmm != "qemu":
        raise UsageError(f"--qmp is QEMU's; --vmm {args.vmm} takes --api")
    if args.follow and (args.force or args.dry_run):
        raise UsageError("--follow keeps to the safe figure: no --force or --dry-run")
    if args.vmm == "qemu" and missing_extra("give-back", "qemu.qmp", "vm"):
        return 2
    need_target(args)
    # Imported here: the backends and the follow loop are host-only code the guest's
    # guestctl never needs (QEMU's brings in qemu.qmp, a host extra).
    from guestagent.host.giveback import oneshot, plan
    from guestagent.host.giveback.text import result_text
    from guestagent.host.vmm.base import VmmError
    from guestagent.host.vmm.connect import open_vmm

    try:
        vmm = open_vmm(args.vmm, args.qmp if args.qmp is not None else args.api, args.timeout)
        try:
            with AgentClient(args.target, timeout=args.timeout) as client:
                agent = oneshot.ClientAgent(client, args.cold_after_ms)
                if args.follow:
                    return _follow(args, client, agent, vmm)
                options = oneshot.Options(
                    via=args.via,
                    to=args.to,
                    force=args.force,
                    dry_run=args.dry_run,
                    device=args.device,
                    settle_timeout=args.settle_timeout,
                )
                result = oneshot.give_back(agent, vmm, options, args.pid)
        finally:
            vmm.close()
    except plan.Refused as e:
        print(f"guestctl: give-back: {e}", file=sys.stderr)
        return 2
    except (grpc.RpcError, plan.GiveBackError, VmmError, AgentError, OSError) as e:
        print(f"guestctl: give-back: {describe_error(e)}", file=sys.stderr)
        return 1
    print(json_or_text(args, result.to_json(), result_text(result)))
    return 0


def _follow(args: argparse.Namespace, client: AgentClient, agent: Agent, vmm: Vmm) -> int:
    """Until SIGTERM or SIGINT, which leave the device where it is."""
    from guestagent.host.giveback import follow

    knob = follow.knob_for(vmm, args.via, args.device)
    policy = follow.Policy(
        hold_seconds=args.hold, stall_threshold=args.stall_threshold, step=args.step
    )
    interval_ms = max(100, round(args.interval * 1000))

    def watch() -> WatchStream:
        return client.watch(interval_ms=interval_ms, cold_after_ms=args.cold_after_ms)

    metrics = None
    server = None
    if args.metrics is not None:
        from guestagent.host.giveback.follow_metrics import FollowMetrics
        from guestagent.host.metrics.server import serve_in_background

        metrics = FollowMetrics(vmm.name, knob.what)
        server = serve_in_background(args.metrics, metrics.families)
    options = follow.FollowOptions(
        json=args.json, gone_seconds=args.gone_after, quiet_seconds=quiet_limit(interval_ms)
    )
    watchdog = Watchdog()
    follower = follow.Follower(
        watch, agent, vmm.name, knob, policy, options, metrics, watchdog=watchdog
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        follower.stop()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return follower.run()
    finally:
        watchdog.stop()
        for number, handler in previous.items():
            signal.signal(number, handler)
        if server is not None:
            server.shutdown()
            server.server_close()


COMMANDS = {
    "give-back": Command(
        "compact, then balloon or unplug to the agent's safe figure (or --to, or --follow it) "
        "through QEMU, Cloud Hypervisor or Firecracker",
        _give_back_arguments,
        _give_back,
    ),
}
