"""guestctl's sizing commands, which need no agent: `plan` sizes a pod's VM and checks its pod
limit covers it; `measure-overhead` boots the guest image at several sizes and fits the
overheads `plan --model` takes."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

import grpc

from guestagent.errors import AgentError
from guestagent.host.client import describe_error
from guestagent.host.commands.common import (
    Command,
    UsageError,
    json_or_text,
    missing_extra,
    seconds,
    size,
)
from guestagent.linux.fs import KernelFS
from guestagent.linux.meminfo import read_system_memory
from guestagent.sizes import MIB

# Where the guest images are when --image-dir is not given (sizing/boot.py reads it too).
IMAGE_DIRECTORY = "GUESTAGENT_IMAGE_DIR"


def _pod_limit(text: str) -> int | None:
    return None if text.strip().lower() in ("max", "none", "-1") else size(text)


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
        limit=size(values["limit"]) if "limit" in values else None,
        request=size(values["request"]) if "request" in values else None,
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
    parser.add_argument("--host-memory", type=size, help="default: this host's MemTotal")
    parser.add_argument(
        "--block-size", type=size, help="hotplug granularity (default: 128Mi, as Kata's)"
    )
    parser.add_argument(
        "--model", help="overhead model from measure-overhead --out (default: built in)"
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
            with open(args.model) as model_file:
                model = model_from_dict(json.load(model_file))
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
    print(json_or_text(args, plan_to_dict(result), plan_text(result)))
    return 0 if result.ok else 1


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(mib <= 0 for mib in sizes):
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
    parser.add_argument("--out", help="write the model as JSON, for plan --model")
    parser.add_argument(
        "--image-dir",
        help=f"where `make image` wrote the guest (image/build; default: ${IMAGE_DIRECTORY})",
    )
    parser.add_argument(
        "--boot-timeout", type=seconds, default=300.0, help="seconds a boot may take (300)"
    )


def _measure_overhead(args: argparse.Namespace) -> int:
    # The harness drives QEMU over QMP; a host install without the vm extra lacks it.
    if missing_extra("measure-overhead", "qemu.qmp", "vm"):
        return 2
    # Imported here: it brings in the QEMU harness, which nothing else in guestctl needs (nor
    # pathlib, which the node daemon goes without).
    from pathlib import Path

    from guestagent.host.sizing.measure import MeasureError, measure_size, table_text
    from guestagent.host.sizing.model import fit_model, model_to_dict

    image_dir = args.image_dir or os.environ.get(IMAGE_DIRECTORY)
    if not image_dir:
        raise UsageError(f"measure-overhead needs --image-dir or ${IMAGE_DIRECTORY}")
    samples = []
    try:
        for guest_mib in args.sizes:
            print(f"guestctl: booting a {guest_mib} MiB guest", file=sys.stderr, flush=True)
            samples.append(measure_size(guest_mib, Path(image_dir), args.boot_timeout))
    except (MeasureError, TimeoutError, OSError, grpc.RpcError) as e:
        print(f"guestctl: measure-overhead: {describe_error(e)}", file=sys.stderr)
        return 1
    booted = ", ".join(str(guest_mib) for guest_mib in args.sizes)
    model = fit_model(samples, f"measured under {samples[0].accel} at {booted} MiB")
    document = model_to_dict(model)
    if args.out:
        with open(args.out, "w") as out:
            out.write(json.dumps(document, indent=2) + "\n")
    print(json_or_text(args, document, table_text(model)))
    return 0


COMMANDS: dict[str, Command] = {
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
}
