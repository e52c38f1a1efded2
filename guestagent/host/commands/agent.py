"""guestctl's commands that are one call to the agent each: the memory report and its stream,
swap, limits, compaction, reclaim and the reclaimer, hotplug onlining, the guest's overhead,
health."""

from __future__ import annotations

import argparse
import functools
import sys

from guestagent.host.client import AgentClient
from guestagent.host.commands.common import (
    AddArguments,
    Command,
    UsageError,
    cold_after_argument,
    counts,
    no_arguments,
    remote,
    shown,
    size,
)
from guestagent.host.commands.common import limit as limit_value
from guestagent.host.display import (
    compact_text,
    limits_text,
    memory_info_text,
    online_text,
    overhead_text,
    reclaim_status_text,
    reclaim_target_text,
    reclaim_text,
    swap_area_text,
)
from guestagent.host.units import SIZE_HELP
from guestagent.v1 import agent_pb2 as pb

# Twice the kernel's shortest PSI trigger window (500 ms; docs/contract.md's WatchMemory).
DEFAULT_WINDOW_US = 1_000_000


def _idle_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--idle-edges",
        type=counts,
        default=[],
        metavar="MS,MS,...",
        help="idle-age bin edges in ms, ascending (default 1000,10000,60000,300000)",
    )
    cold_after_argument(parser)


def _info_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cgroup", action="append", default=[], help="cgroup path; repeatable")
    _idle_arguments(parser)


def _info(client: AgentClient, args: argparse.Namespace) -> str:
    info = client.info(args.cgroup, args.idle_edges, args.cold_after_ms)
    return shown(args, info, memory_info_text)


def _watch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cgroup", action="append", default=[], help="cgroup path; repeatable")
    parser.add_argument(
        "--interval-ms", type=int, default=0, help="also report this often (0: on events only)"
    )
    parser.add_argument("--count", type=int, default=0, help="stop after N messages")
    parser.add_argument("--stall-us", type=int, default=0, help="PSI trigger stall")
    parser.add_argument(
        "--window-us",
        type=int,
        default=DEFAULT_WINDOW_US,
        help=f"PSI trigger window (default {DEFAULT_WINDOW_US})",
    )
    _idle_arguments(parser)


def _watch(client: AgentClient, args: argparse.Namespace) -> str:
    trigger = (
        pb.PressureTrigger(stall_us=args.stall_us, window_us=args.window_us)
        if args.stall_us
        else None
    )
    stream = client.watch(
        args.cgroup, args.interval_ms, trigger, args.idle_edges, args.cold_after_ms
    )
    for number, info in enumerate(stream, 1):
        reason = pb.WatchReason.Name(info.reason).removeprefix("WATCH_REASON_").lower()
        print(f"--- {reason} {' '.join(info.changed_cgroups)}".rstrip(), flush=True)
        print(shown(args, info, memory_info_text), flush=True)
        if args.count and number >= args.count:
            break
    return ""


def _device_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--device", help="device node, e.g. /dev/vdb")
    which.add_argument("--serial", help="virtio serial (udev ID_SERIAL), e.g. swap0")


def _selector(args: argparse.Namespace) -> pb.DeviceSelector:
    if args.serial:
        return pb.DeviceSelector(serial=args.serial)
    return pb.DeviceSelector(path=args.device)


def _swap_enable_arguments(parser: argparse.ArgumentParser) -> None:
    _device_arguments(parser)
    parser.add_argument("--priority", type=int, help="swapon priority (default: the kernel's)")
    parser.add_argument(
        "--discard",
        choices=["both", "pages", "once", "none"],
        default="both",
        help="swapon discard: give freed swap back to the host's disk (default both)",
    )
    parser.add_argument("--wait-ms", type=int, default=0, help="wait for a hot-plugged disk")
    parser.add_argument("--force", action="store_true", help="format over existing data")
    parser.add_argument("--label", default="", help="mkswap label, at most 16 bytes")
    parser.add_argument(
        "--encryption",
        choices=["default", "none", "ephemeral"],
        default="default",
        help="ephemeral: dm-crypt with a key only the guest kernel holds (default in a "
        "confidential guest, the only choice there)",
    )


def _swap_enable(client: AgentClient, args: argparse.Namespace) -> str:
    request = pb.EnableSwapRequest(
        device=_selector(args),
        discard=pb.DiscardPolicy.Value(f"DISCARD_{args.discard.upper()}"),
        wait_ms=args.wait_ms,
        force=args.force,
        label=args.label,
        encryption=pb.SwapEncryption.Value(f"SWAP_ENCRYPTION_{args.encryption.upper()}"),
    )
    if args.priority is not None:
        request.priority = args.priority
    return shown(args, client.enable_swap(request), swap_area_text)


def _swap_disable(client: AgentClient, args: argparse.Namespace) -> str:
    area = client.disable_swap(_selector(args))
    return shown(args, area, lambda a: f"disabled {swap_area_text(a)}")


def _swap_list(client: AgentClient, args: argparse.Namespace) -> str:
    areas = pb.ListSwapsResponse(areas=client.list_swaps())
    return shown(
        args,
        areas,
        lambda listed: "\n".join(swap_area_text(a) for a in listed.areas) or "no active swap areas",
    )


def _limits_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cgroup", required=True, help="cgroup path below the cgroup2 mount")
    unlimited = "; -1 or max: unlimited"
    parser.add_argument(
        "--limit", type=limit_value, help=f"OCI memory.limit: {SIZE_HELP}{unlimited}"
    )
    parser.add_argument(
        "--swap",
        type=limit_value,
        help=f"OCI memory.swap: the memory+swap total, a size{unlimited}",
    )
    parser.add_argument(
        "--reservation", type=limit_value, help=f"OCI memory.reservation, a size{unlimited}"
    )
    parser.add_argument("--create", action="store_true", help="create the cgroup if missing")


def _limits(client: AgentClient, args: argparse.Namespace) -> str:
    memory = pb.LinuxMemory()
    for field in ("limit", "swap", "reservation"):
        value = getattr(args, field)
        if value is not None:
            setattr(memory, field, value)
    applied = client.set_limits(args.cgroup, memory, args.create)
    return shown(args, applied, functools.partial(limits_text, args.cgroup))


def _compact_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", type=int, help="one NUMA node (default: all)")


def _compact(client: AgentClient, args: argparse.Namespace) -> str:
    return shown(args, client.compact(args.node), compact_text)


def _reclaim_now_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cgroup", required=True, help="cgroup path below the cgroup2 mount")
    parser.add_argument("--bytes", type=size, required=True, help=SIZE_HELP)
    parser.add_argument(
        "--drop-caches",
        type=int,
        default=0,
        choices=[0, 1, 2, 3],
        help="then write this to drop_caches (1 page cache, 2 slab, 3 both)",
    )


def _reclaim_now(client: AgentClient, args: argparse.Namespace) -> str:
    result = client.reclaim(args.cgroup, args.bytes, args.drop_caches)
    return shown(args, result, functools.partial(reclaim_text, args.cgroup))


def _reclaim_target_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--cgroup", help="cgroup path below the cgroup2 mount")
    which.add_argument(
        "--workloads",
        action="store_true",
        help="every cgroup the agent takes for a workload, now and as they come (contract 4)",
    )


def _reclaim_on_arguments(parser: argparse.ArgumentParser) -> None:
    _reclaim_target_arguments(parser)
    parser.add_argument("--interval-ms", type=int, help="how often the reclaimer steps")
    parser.add_argument("--stall-target-us", type=int, help="memory.pressure stall per interval")
    parser.add_argument("--max-step-fraction", type=float, help="of memory.current")
    parser.add_argument("--floor-bytes", type=size, help=f"never below this: {SIZE_HELP}")
    parser.add_argument("--anon", action="store_true", help="reclaim anon too (needs swap)")
    parser.add_argument("--refault-guard", type=float, help="fraction of memory.current")


def _reclaim_on(client: AgentClient, args: argparse.Namespace) -> str:
    policy = pb.ReclaimPolicy()
    for field in ("interval_ms", "stall_target_us", "max_step_fraction", "floor_bytes"):
        if getattr(args, field) is not None:
            setattr(policy, field, getattr(args, field))
    if args.refault_guard is not None:
        policy.refault_guard_fraction = args.refault_guard
    if args.anon:
        policy.anon = True
    if args.workloads:
        return shown(args, client.set_workload_reclaim(True, policy), reclaim_target_text)
    return shown(args, client.set_reclaim_policy(args.cgroup, True, policy), reclaim_target_text)


def _reclaim_off(client: AgentClient, args: argparse.Namespace) -> str:
    if args.workloads:
        return shown(args, client.set_workload_reclaim(False), reclaim_target_text)
    target = client.set_reclaim_policy(args.cgroup, False, pb.ReclaimPolicy())
    return shown(args, target, reclaim_target_text)


def _reclaim_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cgroup", action="append", default=[], help="repeatable; default all")


def _reclaim_status(client: AgentClient, args: argparse.Namespace) -> str:
    return shown(args, client.reclaim_status(args.cgroup), reclaim_status_text)


def _reclaim_legacy_arguments(parser: argparse.ArgumentParser) -> None:
    """`reclaim --cgroup C --bytes N`, from before `reclaim now`: still taken, with a warning."""
    parser.add_argument("--cgroup", dest="legacy_cgroup", help=argparse.SUPPRESS)
    parser.add_argument("--bytes", dest="legacy_bytes", type=size, help=argparse.SUPPRESS)
    parser.add_argument(
        "--drop-caches",
        dest="legacy_drop_caches",
        type=int,
        default=0,
        choices=[0, 1, 2, 3],
        help=argparse.SUPPRESS,
    )
    parser.set_defaults(run=_reclaim_legacy)


def _reclaim_legacy(args: argparse.Namespace) -> int:
    if args.legacy_cgroup is None or args.legacy_bytes is None:
        raise UsageError("reclaim needs a command: now, on, off or status")
    print(
        "guestctl: `reclaim --cgroup C --bytes N` is deprecated; use `reclaim now --cgroup C "
        "--bytes N`",
        file=sys.stderr,
    )
    args.cgroup, args.bytes = args.legacy_cgroup, args.legacy_bytes
    args.drop_caches = args.legacy_drop_caches
    return remote(_reclaim_now)(args)


def _online(client: AgentClient, args: argparse.Namespace) -> str:
    return shown(args, client.online_memory(), online_text)


def _overhead_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", action="append", default=[], help="workload cgroup")


def _overhead(client: AgentClient, args: argparse.Namespace) -> str:
    return shown(args, client.overhead(args.workload), overhead_text)


def _health_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service", default="", help="a service name (default: the server)")


def _health(client: AgentClient, args: argparse.Namespace) -> str:
    return client.health(args.service)


# Subcommand groups (`swap enable`) are keys with a space; GROUPS holds the group's help.
GROUPS = {
    "swap": "the guest's swap areas",
    "reclaim": "proactive reclaim now, or the working-set reclaimer: on, off, status",
}
# A group that also runs with no subcommand: what it takes then (and its run).
GROUP_ARGUMENTS: dict[str, AddArguments] = {"reclaim": _reclaim_legacy_arguments}
COMMANDS: dict[str, Command] = {
    "info": Command("one memory report", _info_arguments, remote(_info)),
    "watch": Command("stream memory reports", _watch_arguments, remote(_watch)),
    "swap enable": Command(
        "format (if needed) and enable a swap disk", _swap_enable_arguments, remote(_swap_enable)
    ),
    "swap disable": Command("swapoff an area", _device_arguments, remote(_swap_disable)),
    "swap list": Command("active swap areas", no_arguments, remote(_swap_list)),
    "limits": Command(
        "set memory.max / memory.swap.max / memory.low from OCI values",
        _limits_arguments,
        remote(_limits),
    ),
    "compact": Command(
        "compact memory, with before/after figures", _compact_arguments, remote(_compact)
    ),
    "reclaim now": Command(
        "reclaim --bytes of a cgroup now (memory.reclaim)",
        _reclaim_now_arguments,
        remote(_reclaim_now),
    ),
    "reclaim on": Command(
        "turn the working-set reclaimer on for a cgroup",
        _reclaim_on_arguments,
        remote(_reclaim_on),
    ),
    "reclaim off": Command(
        "turn the working-set reclaimer off for a cgroup",
        _reclaim_target_arguments,
        remote(_reclaim_off),
    ),
    "reclaim status": Command(
        "the working-set reclaimer's targets and compaction",
        _reclaim_status_arguments,
        remote(_reclaim_status),
    ),
    "online-memory": Command("online hot-plugged memory", no_arguments, remote(_online)),
    "overhead": Command("what the guest itself uses", _overhead_arguments, remote(_overhead)),
    "health": Command("grpc.health.v1 status", _health_arguments, remote(_health)),
}
