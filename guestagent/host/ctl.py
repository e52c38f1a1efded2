"""`guestctl`: the host-side command line, talking to a guest's agent or sizing VMs.

Each subcommand is a pair in COMMANDS: a function that adds its flags and one that runs it.
Commands that call the agent are wrapped by `remote`, which opens the client, prints what
the call returns and turns a failed call into one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import grpc

from guestagent.errors import AgentError
from guestagent.host.client import AgentClient, WatchStream, describe_error
from guestagent.host.display import (
    as_json,
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
from guestagent.host.units import SIZE_HELP, parse_limit, parse_size
from guestagent.linux.fs import KernelFS
from guestagent.linux.meminfo import read_system_memory
from guestagent.linux.watch import PSI_MIN_WINDOW_US
from guestagent.sizes import MIB
from guestagent.transport.address import TcpAddress, parse_address
from guestagent.v1 import agent_pb2 as pb

if TYPE_CHECKING:
    from guestagent.host.giveback import Agent
    from guestagent.host.vmm import Vmm

Run = Callable[[argparse.Namespace], int]
Call = Callable[[AgentClient, argparse.Namespace], str]
AddArguments = Callable[[argparse.ArgumentParser], None]


class UsageError(Exception):
    """A command line argparse accepted but the command cannot run with; exit 2 like argparse."""


@dataclass(frozen=True)
class Command:
    help: str
    add_arguments: AddArguments
    run: Run


def remote(call: Call) -> Run:
    """A command that talks to the agent at --target."""

    def run(args: argparse.Namespace) -> int:
        _need_target(args)
        try:
            with AgentClient(args.target, timeout=args.timeout) as client:
                output = call(client, args)
        except (grpc.RpcError, AgentError, OSError) as e:
            print(f"guestctl: {describe_error(e)}", file=sys.stderr)
            return 1
        if output:
            print(output)
        return 0

    return run


def _need_target(args: argparse.Namespace) -> None:
    if args.target is None:
        raise UsageError(f"{args.command} needs --target")


def _missing_extra(command: str, module: str, extra: str) -> bool:
    """True, after saying what to install, when an optional host dependency is absent."""
    top = module.split(".")[0]
    if importlib.util.find_spec(top) is not None and importlib.util.find_spec(module) is not None:
        return False
    print(f"guestctl: {command} needs {module}: pip install 'guestagent[{extra}]'", file=sys.stderr)
    return True


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _limit(text: str) -> int:
    try:
        return parse_limit(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _count(text: str) -> int:
    """A whole number >= 0 (milliseconds): a negative one would reach protobuf's unsigned
    fields as a traceback."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _counts(text: str) -> list[int]:
    return [_count(item) for item in text.split(",")]


def _seconds(text: str) -> float:
    """A finite number of seconds above 0 (nan and inf would never time out)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: seconds must be finite and above 0")
    return value


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """The command takes no flags of its own."""


def _idle_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--idle-edges",
        type=_counts,
        default=[],
        metavar="MS,MS,...",
        help="idle-age bin edges in ms, ascending (default 1000,10000,60000,300000)",
    )
    _cold_after_argument(parser)


def _cold_after_argument(parser: argparse.ArgumentParser) -> None:
    """One name, as the contract's cold_after_ms; `--cold-after` was info's and watch's
    spelling before, and scripts may still use it."""
    for flag, shown in (("--cold-after-ms", True), ("--cold-after", False)):
        parser.add_argument(
            flag,
            dest="cold_after_ms",
            type=_count,
            default=0,
            metavar="MS",
            help="idle age from which memory counts as cold (default 0: the agent's 60000)"
            if shown
            else argparse.SUPPRESS,
        )


def _info_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cgroup", action="append", default=[], help="cgroup path; repeatable")
    _idle_arguments(parser)


def _info(client: AgentClient, args: argparse.Namespace) -> str:
    info = client.info(args.cgroup, args.idle_edges, args.cold_after_ms)
    return as_json(info) if args.json else memory_info_text(info)


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
        default=PSI_MIN_WINDOW_US * 2,
        help=f"PSI trigger window (default {PSI_MIN_WINDOW_US * 2})",
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
    for count, info in enumerate(stream, 1):
        reason = pb.WatchReason.Name(info.reason).removeprefix("WATCH_REASON_").lower()
        text = as_json(info) if args.json else memory_info_text(info)
        print(f"--- {reason} {' '.join(info.changed_cgroups)}".rstrip(), flush=True)
        print(text, flush=True)
        if args.count and count >= args.count:
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
    area = client.enable_swap(request)
    return as_json(area) if args.json else swap_area_text(area)


def _swap_disable(client: AgentClient, args: argparse.Namespace) -> str:
    area = client.disable_swap(_selector(args))
    return as_json(area) if args.json else f"disabled {swap_area_text(area)}"


def _swap_list(client: AgentClient, args: argparse.Namespace) -> str:
    areas = client.list_swaps()
    if args.json:
        return as_json(pb.ListSwapsResponse(areas=areas))
    return "\n".join(swap_area_text(a) for a in areas) or "no active swap areas"


def _limits_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cgroup", required=True, help="cgroup path below the cgroup2 mount")
    unlimited = "; -1 or max: unlimited"
    parser.add_argument("--limit", type=_limit, help=f"OCI memory.limit: {SIZE_HELP}{unlimited}")
    parser.add_argument(
        "--swap", type=_limit, help=f"OCI memory.swap: the memory+swap total, a size{unlimited}"
    )
    parser.add_argument(
        "--reservation", type=_limit, help=f"OCI memory.reservation, a size{unlimited}"
    )
    parser.add_argument("--create", action="store_true", help="create the cgroup if missing")


def _limits(client: AgentClient, args: argparse.Namespace) -> str:
    memory = pb.LinuxMemory()
    for field in ("limit", "swap", "reservation"):
        value = getattr(args, field)
        if value is not None:
            setattr(memory, field, value)
    applied = client.set_limits(args.cgroup, memory, args.create)
    return as_json(applied) if args.json else limits_text(args.cgroup, applied)


def _compact_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", type=int, help="one NUMA node (default: all)")


def _compact(client: AgentClient, args: argparse.Namespace) -> str:
    result = client.compact(args.node)
    return as_json(result) if args.json else compact_text(result)


def _reclaim_now_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cgroup", required=True, help="cgroup path below the cgroup2 mount")
    parser.add_argument("--bytes", type=_size, required=True, help=SIZE_HELP)
    parser.add_argument(
        "--drop-caches",
        type=int,
        default=0,
        choices=[0, 1, 2, 3],
        help="then write this to drop_caches (1 page cache, 2 slab, 3 both)",
    )


def _reclaim_now(client: AgentClient, args: argparse.Namespace) -> str:
    result = client.reclaim(args.cgroup, args.bytes, args.drop_caches)
    return as_json(result) if args.json else reclaim_text(args.cgroup, result)


def _reclaim_on_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cgroup", required=True, help="cgroup path below the cgroup2 mount")
    parser.add_argument("--interval-ms", type=int, help="how often the reclaimer steps")
    parser.add_argument("--stall-target-us", type=int, help="memory.pressure stall per interval")
    parser.add_argument("--max-step-fraction", type=float, help="of memory.current")
    parser.add_argument("--floor-bytes", type=_size, help=f"never below this: {SIZE_HELP}")
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
    target = client.set_reclaim_policy(args.cgroup, True, policy)
    return as_json(target) if args.json else reclaim_target_text(target)


def _reclaim_off_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cgroup", required=True, help="cgroup path below the cgroup2 mount")


def _reclaim_off(client: AgentClient, args: argparse.Namespace) -> str:
    target = client.set_reclaim_policy(args.cgroup, False, pb.ReclaimPolicy())
    return as_json(target) if args.json else reclaim_target_text(target)


def _reclaim_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cgroup", action="append", default=[], help="repeatable; default all")


def _reclaim_status(client: AgentClient, args: argparse.Namespace) -> str:
    status = client.reclaim_status(args.cgroup)
    return as_json(status) if args.json else reclaim_status_text(status)


def _reclaim_legacy_arguments(parser: argparse.ArgumentParser) -> None:
    """`reclaim --cgroup C --bytes N`, from before `reclaim now`: still taken, with a warning."""
    parser.add_argument("--cgroup", dest="legacy_cgroup", help=argparse.SUPPRESS)
    parser.add_argument("--bytes", dest="legacy_bytes", type=_size, help=argparse.SUPPRESS)
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
    result = client.online_memory()
    return as_json(result) if args.json else online_text(result)


def _overhead_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", action="append", default=[], help="workload cgroup")


def _overhead(client: AgentClient, args: argparse.Namespace) -> str:
    result = client.overhead(args.workload)
    return as_json(result) if args.json else overhead_text(result)


def _pod_limit(text: str) -> int | None:
    return None if text.strip().lower() in ("max", "none", "-1") else _size(text)


@dataclass(frozen=True)
class ContainerArgument:
    """One --container, before sizing's Container: sizing is imported only when plan runs,
    so the guest image, whose guestctl never plans, does not carry it."""

    name: str
    limit: int | None
    request: int | None


def _container(text: str) -> ContainerArgument:
    """'limit=512Mi,request=256Mi,name=app'; each key optional, no limit means none."""
    values: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in ("name", "limit", "request"):
            raise argparse.ArgumentTypeError(f"{item!r} is not name=, limit= or request=")
        values[key.strip()] = value.strip()
    return ContainerArgument(
        name=values.get("name", ""),
        limit=_size(values["limit"]) if "limit" in values else None,
        request=_size(values["request"]) if "request" in values else None,
    )


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--container",
        type=_container,
        action="append",
        default=[],
        metavar="limit=SIZE,request=SIZE,name=N",
        help="one per container; a container without limit= adds nothing to the VM",
    )
    parser.add_argument(
        "--pod-limit",
        type=_pod_limit,
        required=True,
        help="the pod's cgroup memory.max on the host (containers' limits + RuntimeClass "
        "overhead), or max",
    )
    parser.add_argument(
        "--default-memory",
        type=int,
        default=2048,
        metavar="MIB",
        help="the runtime's default_memory, the VM's base before the pod's limits (default 2048)",
    )
    parser.add_argument(
        "--default-maxmemory", type=int, default=0, metavar="MIB", help="0: the host's memory"
    )
    parser.add_argument("--host-memory", type=_size, help="default: this host's MemTotal")
    parser.add_argument(
        "--block-size", type=_size, help="hotplug granularity (default: 128Mi, as Kata's)"
    )
    parser.add_argument(
        "--model", type=Path, help="overhead model from measure-overhead --out (default: built in)"
    )
    parser.add_argument(
        "--platform",
        choices=("plain", "sev-snp", "tdx"),
        default="plain",
        help="the built-in model: plain, or a confidential guest's, fitted to a published "
        "survey (docs/sizing.md); confidential VMs are sized exactly, without blocks",
    )


def _plan(args: argparse.Namespace) -> int:
    """Exit 0 when the pod fits, 1 when the preflight fails, 2 on bad input."""
    from guestagent.host.sizing.model import model_from_dict
    from guestagent.host.sizing.plan import Container, PodSizing, plan
    from guestagent.host.sizing.survey import PLAIN, platform_block_size, platform_model
    from guestagent.host.sizing.text import plan_text, plan_to_dict

    if args.model is not None and args.platform != PLAIN:
        # measure-overhead boots plain guests only: a model file is not a confidential one's.
        print(
            f"guestctl: plan: --model and --platform {args.platform} both give the overheads; "
            "use one",
            file=sys.stderr,
        )
        return 2
    try:
        model = platform_model(args.platform)
        if args.model is not None:
            model = model_from_dict(json.loads(args.model.read_text()))
    except (AgentError, OSError, ValueError) as e:
        print(f"guestctl: plan: model {args.model}: {e}", file=sys.stderr)
        return 2
    containers = tuple(
        Container(c.name or f"container{i}", c.limit, c.request)
        for i, c in enumerate(args.container)
    )
    try:
        host_memory = args.host_memory
        if host_memory is None:
            host_memory = read_system_memory(KernelFS()).mem_total
        sizing = PodSizing(
            host_memory=host_memory,
            default_memory=args.default_memory * MIB,
            default_maxmemory=args.default_maxmemory * MIB,
            containers=containers,
            pod_limit=args.pod_limit,
            block_size=(
                platform_block_size(args.platform) if args.block_size is None else args.block_size
            ),
        )
        result = plan(sizing, model)
    except (AgentError, OSError) as e:
        print(f"guestctl: plan: {e}", file=sys.stderr)
        return 2
    print(json.dumps(plan_to_dict(result), indent=2) if args.json else plan_text(result))
    return 0 if result.ok else 1


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(size <= 0 for size in sizes):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of MiB, e.g. 306,756")
    return sizes


def _measure_overhead_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=(306, 406, 756, 1280, 2304),
        metavar="MIB,MIB,...",
        help="guest memory sizes to boot (default 306,406,756,1280,2304)",
    )
    parser.add_argument("--out", type=Path, help="write the model as JSON, for plan --model")
    parser.add_argument("--image-dir", type=Path, help="default: image/build")
    parser.add_argument(
        "--boot-timeout", type=_seconds, default=300.0, help="seconds a boot may take (300)"
    )


def _measure_overhead(args: argparse.Namespace) -> int:
    # The harness drives QEMU over QMP; a host install without the vm extra lacks it.
    if _missing_extra("measure-overhead", "qemu.qmp", "vm"):
        return 2
    # Imported here: it brings in the QEMU harness, which nothing else in guestctl needs.
    from guestagent.host.measure import MeasureError, measure_size, table_text
    from guestagent.host.sizing.model import fit_model, model_to_dict

    samples = []
    try:
        for size in args.sizes:
            print(f"guestctl: booting a {size} MiB guest", file=sys.stderr, flush=True)
            samples.append(measure_size(size, args.image_dir, args.boot_timeout))
    except (MeasureError, TimeoutError, OSError, grpc.RpcError) as e:
        print(f"guestctl: measure-overhead: {describe_error(e)}", file=sys.stderr)
        return 1
    sizes = ", ".join(str(size) for size in args.sizes)
    model = fit_model(samples, f"measured under {samples[0].accel} at {sizes} MiB")
    document = model_to_dict(model)
    if args.out:
        args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(document, indent=2) if args.json else table_text(model))
    return 0


def _listen(text: str) -> TcpAddress:
    try:
        address = parse_address(f"tcp://{text}")
    except AgentError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT: {e}") from None
    if not isinstance(address, TcpAddress):  # Not an assert: python -O strips those.
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return address


def _metrics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        required=True,
        type=_listen,
        metavar="HOST:PORT",
        help="where to serve /metrics, e.g. 127.0.0.1:9464 or [::]:9464 (port 0: any free one)",
    )
    parser.add_argument(
        "--cgroup", action="append", default=[], help="cgroup to report; repeatable"
    )
    parser.add_argument(
        "--interval-ms",
        type=int,
        default=5000,
        help="how often the agent sends a report besides the memory events and PSI it pushes",
    )


def _metrics(args: argparse.Namespace) -> int:
    """Runs until SIGTERM or SIGINT; exit 2 without prometheus_client, 1 if --listen fails."""
    if _missing_extra("metrics", "prometheus_client", "host"):
        return 2
    _need_target(args)
    # Imported here: prometheus_client is an optional host extra.
    from guestagent.host.exporter import serve_metrics

    try:
        return serve_metrics(args.target, args.listen, args.cgroup, args.interval_ms)
    except (AgentError, OSError) as e:
        print(f"guestctl: metrics: {e}", file=sys.stderr)
        return 1


def _give_back_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vmm",
        choices=["qemu", "cloud-hypervisor", "firecracker"],
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
        type=_size,
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
    parser.add_argument("--force", action="store_true", help="go below the safe figure")
    parser.add_argument("--dry-run", action="store_true", help="say what it would do, do nothing")
    parser.add_argument("--pid", type=int, help="the VMM's pid for its RSS (default: the peer)")
    _cold_after_argument(parser)
    parser.add_argument(
        "--settle-timeout",
        type=_seconds,
        default=600.0,
        metavar="SECONDS",
        help="how long the device may take to reach its size (default 600)",
    )
    follow = parser.add_argument_group("--follow")
    follow.add_argument(
        "--interval", type=_seconds, default=2.0, metavar="S", help="the agent's report interval"
    )
    follow.add_argument(
        "--hold",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="how long the figure must allow more before the device takes it",
    )
    follow.add_argument(
        "--stall-threshold",
        type=_share,
        default=0.10,
        metavar="SHARE",
        help="give back at once when some task stalled on memory this share of the interval",
    )
    follow.add_argument(
        "--step",
        type=_size,
        default=128 << 20,
        help="what to give back on a stall or when the guest needs all it has (doubling, "
        "twice at most, while it goes on)",
    )
    follow.add_argument(
        "--metrics", type=_listen, metavar="HOST:PORT", help="serve Prometheus metrics here"
    )


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value} is not in (0, 1]")
    return value


def _give_back(args: argparse.Namespace) -> int:
    """Exit 0 when done (or a dry run, or a follow loop stopped), 2 on a refused size or bad
    flags, 1 when a call fails."""
    if not (args.to is not None or args.safe or args.follow):
        raise UsageError("give-back needs one of --to, --safe, --follow")
    if args.qmp is not None and args.vmm != "qemu":
        raise UsageError(f"--qmp is QEMU's; --vmm {args.vmm} takes --api")
    if args.follow and (args.force or args.dry_run):
        raise UsageError("--follow keeps to the safe figure: no --force or --dry-run")
    if args.vmm == "qemu" and _missing_extra("give-back", "qemu.qmp", "vm"):
        return 2
    if args.follow and args.metrics and _missing_extra("give-back", "prometheus_client", "host"):
        return 2
    _need_target(args)
    # Imported here: the backends and the follow loop are host-only code the guest's
    # guestctl never needs (QEMU's brings in qemu.qmp, a host extra).
    from guestagent.host import giveback
    from guestagent.host.vmm import VmmError

    try:
        vmm = _open_vmm(args)
        try:
            with AgentClient(args.target, timeout=args.timeout) as client:
                agent = giveback.ClientAgent(client, args.cold_after_ms)
                if args.follow:
                    return _follow(args, client, agent, vmm)
                options = giveback.Options(
                    via=args.via,
                    to=args.to,
                    force=args.force,
                    dry_run=args.dry_run,
                    device=args.device,
                    settle_timeout=args.settle_timeout,
                )
                result = giveback.give_back(agent, vmm, options, args.pid)
        finally:
            vmm.close()
    except giveback.Refused as e:
        print(f"guestctl: give-back: {e}", file=sys.stderr)
        return 2
    except (grpc.RpcError, giveback.GiveBackError, VmmError, AgentError, OSError) as e:
        print(f"guestctl: give-back: {describe_error(e)}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else giveback.result_text(result))
    return 0


def _open_vmm(args: argparse.Namespace) -> Vmm:
    path = args.qmp if args.qmp is not None else args.api
    if args.vmm == "cloud-hypervisor":
        from guestagent.host.cloud_hypervisor import CloudHypervisorVmm

        return CloudHypervisorVmm(path, args.timeout)
    if args.vmm == "firecracker":
        from guestagent.host.firecracker import FirecrackerVmm

        return FirecrackerVmm(path, args.timeout)
    from guestagent.host.qmp import QemuMonitor, QemuVmm

    return QemuVmm(QemuMonitor(path, args.timeout))


def _follow(args: argparse.Namespace, client: AgentClient, agent: Agent, vmm: Vmm) -> int:
    """Until SIGTERM or SIGINT, which leave the device where it is."""
    from guestagent.host import follow

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
        from guestagent.host.exporter import FollowMetrics, serve_in_background

        metrics = FollowMetrics(vmm.name, knob.what)
        server = serve_in_background(args.metrics, metrics.registry)
    options = follow.FollowOptions(json=args.json)
    follower = follow.Follower(watch, agent, vmm.name, knob, policy, options, metrics)

    def stop(signum: int, frame: FrameType | None) -> None:
        follower.stop()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return follower.run()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if server is not None:
            server.shutdown()
            server.server_close()


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
    "swap list": Command("active swap areas", _no_arguments, remote(_swap_list)),
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
        _reclaim_off_arguments,
        remote(_reclaim_off),
    ),
    "reclaim status": Command(
        "the working-set reclaimer's targets and compaction",
        _reclaim_status_arguments,
        remote(_reclaim_status),
    ),
    "online-memory": Command("online hot-plugged memory", _no_arguments, remote(_online)),
    "overhead": Command("what the guest itself uses", _overhead_arguments, remote(_overhead)),
    "plan": Command(
        "size a pod's VM and check its pod limit covers it (no agent needed)",
        _plan_arguments,
        _plan,
    ),
    "measure-overhead": Command(
        "boot the guest image at several sizes and fit the overheads",
        _measure_overhead_arguments,
        _measure_overhead,
    ),
    "give-back": Command(
        "compact, then balloon or unplug to the agent's safe figure (or --to, or --follow it) "
        "through QEMU, Cloud Hypervisor or Firecracker",
        _give_back_arguments,
        _give_back,
    ),
    "health": Command("grpc.health.v1 status", _health_arguments, remote(_health)),
    "metrics": Command(
        "serve the memory report to Prometheus, fed by WatchMemory",
        _metrics_arguments,
        _metrics,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="guestctl",
        description="talk to a guest's agent",
        epilog=f"Sizes: {SIZE_HELP}.",
    )
    parser.add_argument(
        "--target",
        help="vsock://CID:PORT, hvsock:///path/vsock.sock:PORT, unix:///PATH or tcp://HOST:PORT "
        "(every command but plan and measure-overhead needs one)",
    )
    parser.add_argument("--json", action="store_true", help="print protobuf JSON")
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="how long each call to the agent may take, connecting included (default 30)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for name, command in COMMANDS.items():
        group, _, sub = name.partition(" ")
        if sub:
            if group not in groups:
                group_parser = commands.add_parser(group, help=GROUPS[group])
                if group in GROUP_ARGUMENTS:
                    GROUP_ARGUMENTS[group](group_parser)
                groups[group] = group_parser.add_subparsers(
                    dest=f"{group}_command", required=group not in GROUP_ARGUMENTS
                )
            subparser = groups[group].add_parser(sub, help=command.help)
        else:
            subparser = commands.add_parser(name, help=command.help)
        command.add_arguments(subparser)
        subparser.set_defaults(run=command.run)
    return parser


def attach_negative_values(argv: Sequence[str]) -> list[str]:
    """`--limit -1G` as `--limit=-1G`: argparse reads a word that starts with `-` and is not a
    plain number as an option, and would say only "expected one argument"; attached, the
    value reaches the size parser, which says what it accepts."""
    words: list[str] = []
    for word in argv:
        if words and _NEGATIVE.match(word) and words[-1].startswith("--") and "=" not in words[-1]:
            words[-1] = f"{words[-1]}={word}"
        else:
            words.append(word)
    return words


_NEGATIVE = re.compile(r"-\d")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(attach_negative_values(sys.argv[1:] if argv is None else argv))
    run: Run = args.run
    try:
        return run(args)
    except UsageError as e:
        parser.error(str(e))
