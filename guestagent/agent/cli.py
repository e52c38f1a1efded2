"""`guestagent serve`: the in-guest daemon's command line. guestctl lives in ctl.py, so
neither loads the other's modules at start."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path

from guestagent import jsonlog
from guestagent.agent.daemon import ServerConfig, serve
from guestagent.errors import AgentError
from guestagent.linux.fs import KernelFS
from guestagent.transport import DEFAULT_VSOCK_PORT, parse_address


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="guestagent", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="run the in-guest agent")
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
    serve_cmd.add_argument("--root", type=Path, default=Path("/"), help="kernel file tree root")
    serve_cmd.add_argument(
        "--cgroup-mount", default="sys/fs/cgroup", help="cgroup2 mount below root"
    )
    serve_cmd.add_argument("--grace-seconds", type=float, default=10.0)
    serve_cmd.add_argument(
        "--online-memory",
        choices=["online", "online_movable", "online_kernel", "off"],
        default="online",
        help="how to online hot-plugged memory blocks (online_movable lets the host unplug)",
    )
    serve_cmd.add_argument(
        "--reclaim",
        action="append",
        default=[],
        metavar="CGROUP",
        help="run the working-set reclaimer on this cgroup with the default policy; repeatable",
    )
    serve_cmd.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)

    jsonlog.configure(args.log_level)
    try:
        config = ServerConfig(
            listen=tuple(
                parse_address(a) for a in args.listen or [f"vsock://:{DEFAULT_VSOCK_PORT}"]
            ),
            fs=KernelFS(args.root, args.cgroup_mount),
            allowed_cids=frozenset({2, *args.allow_cid}),
            grace_seconds=args.grace_seconds,
            online_memory=None if args.online_memory == "off" else args.online_memory,
            reclaim=tuple(args.reclaim),
        )
        asyncio.run(serve(config))
    except (AgentError, OSError) as e:
        jsonlog.EventLog("guestagent").error("fatal", error=str(e))
        return 1
    return 0
