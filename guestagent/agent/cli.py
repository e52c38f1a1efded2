"""`guestagent serve`: the in-guest daemon's command line. guestctl lives in ctl.py, so
neither loads the other's modules at start.

The daemon (grpc, protobuf) is imported only after the agent has moved into its own cgroup,
so the bulk of its memory is charged to, and protected by, that cgroup. argparse is
imported only to parse, and dropped once the agent has its options.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING

from guestagent import jsonlog
from guestagent.errors import AgentError
from guestagent.help_formatter import help_formatter
from guestagent.linux.confidential import SETTINGS
from guestagent.linux.kernel import Kernel
from guestagent.linux.syscalls import limit_malloc_arenas, refuse_huge_pages
from guestagent.ops import kernel_switches
from guestagent.ops.hotplug import AUTO_MOVABLE, DEFAULT_MOVABLE_RATIO, POLICIES, OnlinePolicy
from guestagent.ops.idle import DEFAULT_AGING_INTERVAL_S, MIN_AGING_INTERVAL_S
from guestagent.ops.self_cgroup import lock_self, protect_self
from guestagent.transport.address import DEFAULT_VSOCK_PORT, HOST_CID, parse_address

if TYPE_CHECKING:
    import argparse

# The main thread's arena and one for every other thread: a 4-minute hostile soak grew the
# agent's RSS 1.10x with glibc's default (8 per core) and 1.05x with two (docs/measurements.md).
MALLOC_ARENAS = 2
# What only the command line needs: about 0.3 MiB of heap that, dropped once the options are
# parsed, the daemon's imports reuse (docs/measurements.md).
PARSE_ONLY_MODULES = ("argparse", "gettext")


def command(argv: Sequence[str]) -> int:
    """main(), with argparse dropped between the parse and the run. Only a process's entry
    may call it (agent/entry.py): the modules it drops cannot be used again."""
    options = command_line_options(argv)
    forget_modules(PARSE_ONLY_MODULES)
    return run(options)


def forget_modules(names: Sequence[str]) -> None:
    """Drop modules nothing will use again, so their memory is freed now. Only a process's
    entry may: a module imported again after this is a second copy, whose classes are not the
    first's (a test run's pytest holds argparse's)."""
    for name in names:
        sys.modules.pop(name, None)
    gc.collect()  # A module's functions and its namespace hold each other.


def build_parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog="guestagent",
        description="the in-guest memory agent",
        formatter_class=help_formatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser(
        "serve", help="run the in-guest agent", formatter_class=help_formatter
    )
    serve_cmd.add_argument(
        "--listen",
        action="append",
        metavar="ADDR",
        help="vsock://:PORT, unix:///PATH or tcp://HOST:PORT; repeatable (default vsock://:6464)",
    )
    serve_cmd.add_argument(
        "--allow-cid",
        action="append",
        type=int,
        default=[],
        metavar="CID",
        help="also accept vsock peers with this CID (the host, CID 2, always is)",
    )
    serve_cmd.add_argument("--root", default="/", help="kernel file tree root")
    serve_cmd.add_argument(
        "--cgroup-mount", default="sys/fs/cgroup", help="cgroup2 mount below root"
    )
    serve_cmd.add_argument(
        "--grace-seconds",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM, how long calls in flight may run on before they are cut (default 10)",
    )
    serve_cmd.add_argument(
        "--online-memory",
        choices=[*POLICIES, "off"],
        default=AUTO_MOVABLE,
        help="how to online hot-plugged memory blocks: auto-movable puts them in ZONE_MOVABLE "
        "(which the host can unplug) up to --movable-ratio of the boot memory, the rest in a "
        "kernel zone; the others write that state to every block",
    )
    serve_cmd.add_argument(
        "--movable-ratio",
        type=int,
        default=DEFAULT_MOVABLE_RATIO,
        metavar="PERCENT",
        help="auto-movable: movable memory at most this percentage of the boot memory "
        "(default 301, the kernel's memory_hotplug.auto_movable_ratio)",
    )
    serve_cmd.add_argument(
        "--no-self-cgroup",
        action="store_true",
        help="stay in the cgroup it was started in (default: move into /guestagent with "
        "memory.min and memory.high, unless already in a service's own cgroup)",
    )
    serve_cmd.add_argument(
        "--no-lock-memory",
        action="store_true",
        help="leave its memory to reclaim like any process's (default: lock each page it "
        "touches, so a thrashing guest does not swap the agent out)",
    )
    serve_cmd.add_argument(
        "--reclaim",
        action="append",
        default=[],
        metavar="CGROUP",
        help="run the working-set reclaimer on this cgroup with the default policy; repeatable",
    )
    serve_cmd.add_argument(
        "--max-connections",
        type=int,
        default=256,
        metavar="N",
        help="relayed (vsock, unix) connections held at once; the surplus is closed at once "
        "(default 256, fewer if RLIMIT_NOFILE does not cover them)",
    )
    serve_cmd.add_argument(
        "--max-watches",
        type=int,
        default=4096,
        metavar="N",
        help="cgroups watched by all WatchMemory streams together (default 4096); "
        "a stream over it is RESOURCE_EXHAUSTED",
    )
    serve_cmd.add_argument(
        "--confidential",
        choices=SETTINGS,
        default="auto",
        help="whether this is a confidential guest (SEV-SNP, TDX), where swap is encrypted and "
        "never in the clear: auto asks the kernel; yes and no overrule it",
    )
    serve_cmd.add_argument(
        "--idle-aging",
        type=float,
        default=DEFAULT_AGING_INTERVAL_S,
        metavar="SECONDS",
        help="age the multi-gen LRU's generations this often for the idle ages and the "
        f"give-back figures (default {DEFAULT_AGING_INTERVAL_S:g}; at least "
        f"{MIN_AGING_INTERVAL_S:g}; 0 turns the aging off and the figures absent)",
    )
    serve_cmd.add_argument(
        "--delayacct",
        choices=kernel_switches.MODES,
        default=kernel_switches.ON,
        help="turn delay accounting (kernel.task_delayacct) on at start, the stall signal "
        "where the guest has no PSI (on, the default), or leave it as found (keep)",
    )
    serve_cmd.add_argument(
        "--mglru",
        choices=kernel_switches.MODES,
        default=kernel_switches.ON,
        help="turn the multi-gen LRU (/sys/kernel/mm/lru_gen/enabled) on at start where the "
        "kernel has it (on, the default), or leave it as found (keep)",
    )
    serve_cmd.add_argument(
        "--pcp-lists",
        choices=kernel_switches.MODES,
        default=kernel_switches.ON,
        help="bound the kernel's per-CPU free lists at start (vm.percpu_pagelist_high_fraction "
        f"{kernel_switches.PCP_HIGH_FRACTION}), whose pages free page reporting never hands "
        "back (on, the default), or leave them as found (keep)",
    )
    serve_cmd.add_argument(
        "--stall-signal",
        choices=("auto", "delayacct"),
        default="auto",
        help="the reclaimer's stall signal: PSI where the cgroup has memory.pressure, else "
        "delay accounting (auto); delayacct uses delay accounting everywhere, and reports "
        "show it beside PSI (for comparing the two)",
    )
    serve_cmd.add_argument(
        "--log-level",
        default="info",
        help="JSON log lines on stderr from this level up: debug, info, warning, error "
        "(default info)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run(command_line_options(argv))


def command_line_options(argv: Sequence[str] | None) -> SimpleNamespace:
    """The command line's options, checked, in a namespace that holds nothing of argparse's
    (its Namespace's methods would keep the whole module alive)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if 0 < args.idle_aging < MIN_AGING_INTERVAL_S or args.idle_aging < 0:
        parser.error(f"--idle-aging {args.idle_aging:g}: 0, or at least {MIN_AGING_INTERVAL_S:g}")
    return SimpleNamespace(**vars(args))


def run(args: SimpleNamespace) -> int:
    jsonlog.configure(args.log_level)
    if "MALLOC_ARENA_MAX" not in os.environ:  # An operator's setting wins.
        limit_malloc_arenas(MALLOC_ARENAS)
    # Where THP is "always", 2 MiB pages for a few KiB in use cost the agent 2-4 MiB of
    # RssAnon in a guest (docs/measurements.md); before grpc and the heap grow.
    refuse_huge_pages()
    kernel = Kernel(args.root, args.cgroup_mount)
    if not args.no_self_cgroup:
        protect_self(kernel)
    if not args.no_lock_memory:
        lock_self(kernel)  # Before the daemon's imports: what they map is locked as touched.
    import asyncio

    from guestagent.agent.daemon import ServerConfig, serve

    try:
        config = ServerConfig(
            listen=tuple(
                parse_address(a) for a in args.listen or [f"vsock://:{DEFAULT_VSOCK_PORT}"]
            ),
            kernel=kernel,
            allowed_cids=frozenset({HOST_CID, *args.allow_cid}),
            grace_seconds=args.grace_seconds,
            online_memory=None
            if args.online_memory == "off"
            else OnlinePolicy(args.online_memory, args.movable_ratio),
            reclaim=tuple(args.reclaim),
            max_connections=args.max_connections,
            max_watches=args.max_watches,
            confidential=args.confidential,
            idle_aging_s=args.idle_aging,
            delayacct=args.delayacct,
            mglru=args.mglru,
            pcp_lists=args.pcp_lists,
            stall_signal=args.stall_signal,
        )
        asyncio.run(serve(config))
    except (AgentError, OSError) as e:
        jsonlog.EventLog("guestagent").error("fatal", error=str(e))
        return 1
    return 0
