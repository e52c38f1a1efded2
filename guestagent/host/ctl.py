"""`guestctl`: the host-side command line, talking to a guest's agent or sizing VMs."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from guestagent.errors import AgentError
from guestagent.host.client import AgentClient, describe_error
from guestagent.host.display import (
    as_json,
    compact_text,
    limits_text,
    memory_info_text,
    online_text,
    overhead_text,
    parse_size,
    reclaim_status_text,
    reclaim_target_text,
    reclaim_text,
    swap_area_text,
)
from guestagent.host.sizing import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MODEL,
    MIB,
    Container,
    PodSizing,
    fit_model,
    model_from_dict,
    model_to_dict,
    plan,
    plan_text,
    plan_to_dict,
)
from guestagent.linux.fs import KernelFS
from guestagent.linux.meminfo import read_system_memory
from guestagent.linux.watch import PSI_MIN_WINDOW_US
from guestagent.v1 import agent_pb2 as pb


def _info(client: AgentClient, args: argparse.Namespace) -> str:
    info = client.info(args.cgroup)
    return as_json(info) if args.json else memory_info_text(info)


def _watch(client: AgentClient, args: argparse.Namespace) -> str:
    trigger = (
        pb.PressureTrigger(stall_us=args.stall_us, window_us=args.window_us)
        if args.stall_us
        else None
    )
    for count, info in enumerate(client.watch(args.cgroup, args.interval_ms, trigger), 1):
        reason = pb.WatchReason.Name(info.reason).removeprefix("WATCH_REASON_").lower()
        text = as_json(info) if args.json else memory_info_text(info)
        print(f"--- {reason} {' '.join(info.changed_cgroups)}".rstrip(), flush=True)
        print(text, flush=True)
        if args.count and count >= args.count:
            break
    return ""


def _selector(args: argparse.Namespace) -> pb.DeviceSelector:
    if args.serial:
        return pb.DeviceSelector(serial=args.serial)
    return pb.DeviceSelector(path=args.device)


def _swap_enable(client: AgentClient, args: argparse.Namespace) -> str:
    request = pb.EnableSwapRequest(
        device=_selector(args),
        discard=f"DISCARD_{args.discard.upper()}",
        wait_ms=args.wait_ms,
        force=args.force,
        label=args.label,
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


def _add_device_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--device", help="device node, e.g. /dev/vdb")
    which.add_argument("--serial", help="virtio serial (udev ID_SERIAL), e.g. swap0")


def _limits(client: AgentClient, args: argparse.Namespace) -> str:
    memory = pb.LinuxMemory()
    for field in ("limit", "swap", "reservation"):
        value = getattr(args, field)
        if value is not None:
            setattr(memory, field, value)
    applied = client.set_limits(args.cgroup, memory, args.create)
    return as_json(applied) if args.json else limits_text(args.cgroup, applied)


def _compact(client: AgentClient, args: argparse.Namespace) -> str:
    result = client.compact(args.node)
    return as_json(result) if args.json else compact_text(result)


def _reclaim(client: AgentClient, args: argparse.Namespace) -> str:
    if args.mode == "status":
        status = client.reclaim_status(args.cgroup)
        return as_json(status) if args.json else reclaim_status_text(status)
    if args.mode in ("on", "off"):
        if len(args.cgroup) != 1:
            raise AgentError(f"reclaim {args.mode} takes exactly one --cgroup")
        policy = pb.ReclaimPolicy()
        for field in ("interval_ms", "stall_target_us", "max_step_fraction", "floor_bytes"):
            if getattr(args, field) is not None:
                setattr(policy, field, getattr(args, field))
        if args.refault_guard is not None:
            policy.refault_guard_fraction = args.refault_guard
        if args.anon:
            policy.anon = True
        target = client.set_reclaim_policy(args.cgroup[0], args.mode == "on", policy)
        return as_json(target) if args.json else reclaim_target_text(target)
    # No mode: one proactive reclaim of --bytes, now.
    if len(args.cgroup) != 1 or args.bytes is None:
        raise AgentError("reclaim needs one --cgroup and --bytes (or: reclaim on|off|status)")
    result = client.reclaim(args.cgroup[0], args.bytes, args.drop_caches)
    return as_json(result) if args.json else reclaim_text(args.cgroup[0], result)


def _online(client: AgentClient, args: argparse.Namespace) -> str:
    result = client.online_memory()
    return as_json(result) if args.json else online_text(result)


def _overhead(client: AgentClient, args: argparse.Namespace) -> str:
    result = client.overhead(args.workload)
    return as_json(result) if args.json else overhead_text(result)


def _quantity(text: str) -> int:
    """A size as `limits` takes it (64M, 1G), or in Kubernetes' binary units (512Mi, 2Gi)."""
    text = text.strip()
    try:
        return parse_size(text + "B" if text.endswith("i") else text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _pod_limit(text: str) -> int | None:
    return None if text.strip().lower() in ("max", "none", "-1") else _quantity(text)


def _container(text: str) -> Container:
    """'limit=512Mi,request=256Mi,name=app'; each key optional, no limit means none."""
    values: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in ("name", "limit", "request"):
            raise argparse.ArgumentTypeError(f"{item!r} is not name=, limit= or request=")
        values[key.strip()] = value.strip()
    return Container(
        name=values.get("name", ""),
        limit=_quantity(values["limit"]) if "limit" in values else None,
        request=_quantity(values["request"]) if "request" in values else None,
    )


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(size <= 0 for size in sizes):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of MiB, e.g. 306,756")
    return sizes


def _plan(args: argparse.Namespace) -> int:
    """Exit 0 when the pod fits, 1 when the preflight fails, 2 on bad input."""
    try:
        model = DEFAULT_MODEL
        if args.model is not None:
            model = model_from_dict(json.loads(args.model.read_text()))
    except (AgentError, OSError, ValueError) as e:
        print(f"guestctl: plan: model {args.model}: {e}", file=sys.stderr)
        return 2
    containers = tuple(
        c if c.name else Container(f"container{i}", c.limit, c.request)
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
            block_size=args.block_size,
        )
        result = plan(sizing, model)
    except (AgentError, OSError) as e:
        print(f"guestctl: plan: {e}", file=sys.stderr)
        return 2
    print(json.dumps(plan_to_dict(result), indent=2) if args.json else plan_text(result))
    return 0 if result.ok else 1


def _measure_overhead(args: argparse.Namespace) -> int:
    # The harness drives QEMU over QMP; a host install without the vm extra lacks it.
    if importlib.util.find_spec("qemu") is None or importlib.util.find_spec("qemu.qmp") is None:
        print(
            "guestctl: measure-overhead needs qemu.qmp: pip install 'guestagent[vm]'",
            file=sys.stderr,
        )
        return 2
    # Imported here: it brings in the QEMU harness, which nothing else in guestctl needs.
    from guestagent.host.measure import MeasureError, measure_size, table_text

    samples = []
    try:
        for size in args.sizes:
            print(f"guestctl: booting a {size} MiB guest", file=sys.stderr, flush=True)
            samples.append(measure_size(size, args.image_dir, args.boot_timeout))
    except (MeasureError, TimeoutError, OSError, grpc.RpcError) as e:
        detail = describe_error(e) if isinstance(e, grpc.RpcError) else str(e)
        print(f"guestctl: measure-overhead: {detail}", file=sys.stderr)
        return 1
    sizes = ", ".join(str(size) for size in args.sizes)
    model = fit_model(samples, f"measured under {samples[0].accel} at {sizes} MiB")
    document = model_to_dict(model)
    if args.out:
        args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(document, indent=2) if args.json else table_text(model))
    return 0


def _health(client: AgentClient, args: argparse.Namespace) -> str:
    return client.health(args.service)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="guestctl", description="talk to a guest's agent")
    parser.add_argument(
        "--target",
        help="vsock://CID:PORT, hvsock:///path/vsock.sock:PORT, unix:///PATH or tcp://HOST:PORT "
        "(every command but plan and measure-overhead needs one)",
    )
    parser.add_argument("--json", action="store_true", help="print protobuf JSON")
    parser.add_argument("--timeout", type=float, default=30.0)
    commands = parser.add_subparsers(dest="command", required=True)

    info = commands.add_parser("info", help="one memory report")
    info.add_argument("--cgroup", action="append", default=[], help="cgroup path; repeatable")
    info.set_defaults(run=_info)

    watch = commands.add_parser("watch", help="stream memory reports")
    watch.add_argument("--cgroup", action="append", default=[])
    watch.add_argument("--interval-ms", type=int, default=0)
    watch.add_argument("--count", type=int, default=0, help="stop after N messages")
    watch.add_argument("--stall-us", type=int, default=0, help="PSI trigger stall")
    watch.add_argument("--window-us", type=int, default=PSI_MIN_WINDOW_US * 2)
    watch.set_defaults(run=_watch)

    swap = commands.add_parser("swap", help="the guest's swap areas").add_subparsers(
        dest="swap_command", required=True
    )
    enable = swap.add_parser("enable", help="format (if needed) and enable a swap disk")
    _add_device_arguments(enable)
    enable.add_argument("--priority", type=int)
    enable.add_argument("--discard", choices=["both", "pages", "once", "none"], default="both")
    enable.add_argument("--wait-ms", type=int, default=0, help="wait for a hot-plugged disk")
    enable.add_argument("--force", action="store_true", help="format over existing data")
    enable.add_argument("--label", default="")
    enable.set_defaults(run=_swap_enable)
    disable = swap.add_parser("disable", help="swapoff an area")
    _add_device_arguments(disable)
    disable.set_defaults(run=_swap_disable)
    swap.add_parser("list", help="active swap areas").set_defaults(run=_swap_list)

    limits = commands.add_parser(
        "limits", help="set memory.max / memory.swap.max / memory.low from OCI values"
    )
    limits.add_argument("--cgroup", required=True)
    limits.add_argument("--limit", type=parse_size, help="OCI memory.limit: bytes (64M) or -1")
    limits.add_argument("--swap", type=parse_size, help="OCI memory.swap: memory+swap total")
    limits.add_argument("--reservation", type=parse_size, help="OCI memory.reservation")
    limits.add_argument("--create", action="store_true", help="create the cgroup if missing")
    limits.set_defaults(run=_limits)

    compact = commands.add_parser("compact", help="compact memory, with before/after figures")
    compact.add_argument("--node", type=int)
    compact.set_defaults(run=_compact)

    reclaim = commands.add_parser(
        "reclaim",
        help="proactive reclaim now (--bytes), or the working-set reclaimer: on, off, status",
    )
    reclaim.add_argument("mode", nargs="?", choices=["on", "off", "status"])
    reclaim.add_argument("--cgroup", action="append", default=[], help="status: repeatable")
    reclaim.add_argument("--bytes", type=parse_size)
    reclaim.add_argument("--drop-caches", type=int, default=0, choices=[0, 1, 2, 3])
    reclaim.add_argument("--interval-ms", type=int)
    reclaim.add_argument("--stall-target-us", type=int, help="memory.pressure stall per interval")
    reclaim.add_argument("--max-step-fraction", type=float, help="of memory.current")
    reclaim.add_argument("--floor-bytes", type=parse_size)
    reclaim.add_argument("--anon", action="store_true", help="reclaim anon too (needs swap)")
    reclaim.add_argument("--refault-guard", type=float, help="fraction of memory.current")
    reclaim.set_defaults(run=_reclaim)

    commands.add_parser("online-memory", help="online hot-plugged memory").set_defaults(run=_online)
    overhead = commands.add_parser("overhead", help="what the guest itself uses")
    overhead.add_argument("--workload", action="append", default=[], help="workload cgroup")
    overhead.set_defaults(run=_overhead)

    plan_parser = commands.add_parser(
        "plan", help="size a pod's VM and check its pod limit covers it (no agent needed)"
    )
    plan_parser.add_argument(
        "--container",
        type=_container,
        action="append",
        default=[],
        metavar="limit=SIZE,request=SIZE,name=N",
        help="one per container; a container without limit= adds nothing to the VM",
    )
    plan_parser.add_argument(
        "--pod-limit",
        type=_pod_limit,
        required=True,
        help="the pod's cgroup memory.max on the host (containers' limits + RuntimeClass "
        "overhead), or max",
    )
    plan_parser.add_argument("--default-memory", type=int, default=2048, metavar="MIB")
    plan_parser.add_argument(
        "--default-maxmemory", type=int, default=0, metavar="MIB", help="0: the host's memory"
    )
    plan_parser.add_argument("--host-memory", type=_quantity, help="default: this host's MemTotal")
    plan_parser.add_argument(
        "--block-size", type=_quantity, default=DEFAULT_BLOCK_SIZE, help="hotplug granularity"
    )
    plan_parser.add_argument(
        "--model", type=Path, help="overhead model from measure-overhead --out (default: built in)"
    )
    plan_parser.set_defaults(local=_plan)

    measure = commands.add_parser(
        "measure-overhead", help="boot the guest image at several sizes and fit the overheads"
    )
    measure.add_argument(
        "--sizes", type=_sizes, default=(306, 406, 756, 1280, 2304), metavar="MIB,MIB,..."
    )
    measure.add_argument("--out", type=Path, help="write the model as JSON, for plan --model")
    measure.add_argument("--image-dir", type=Path, help="default: image/build")
    measure.add_argument("--boot-timeout", type=float, default=300.0)
    measure.set_defaults(local=_measure_overhead)

    check = commands.add_parser("health", help="grpc.health.v1 status")
    check.add_argument("--service", default="")
    check.set_defaults(run=_health)

    args = parser.parse_args(argv)
    if "local" in args:
        local: Callable[[argparse.Namespace], int] = args.local
        return local(args)
    if args.target is None:
        parser.error(f"{args.command} needs --target")
    run: Callable[[AgentClient, argparse.Namespace], str] = args.run
    try:
        with AgentClient(args.target, timeout=args.timeout) as client:
            output = run(client, args)
    except grpc.RpcError as e:
        print(f"guestctl: {describe_error(e)}", file=sys.stderr)
        return 1
    except (AgentError, OSError) as e:
        print(f"guestctl: {e}", file=sys.stderr)
        return 1
    if output:
        print(output)
    return 0
