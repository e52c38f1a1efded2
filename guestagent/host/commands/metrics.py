"""`guestctl metrics`: an agent's memory report served to Prometheus, fed by WatchMemory."""

from __future__ import annotations

import argparse
import sys

from guestagent.errors import AgentError
from guestagent.host.commands.common import Command, listen_address, need_target


def _metrics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        required=True,
        type=listen_address,
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
    """Runs until SIGTERM or SIGINT; exit 1 if --listen fails."""
    need_target(args)
    # Imported here: the feed and the server are code only this command runs.
    from guestagent.host.metrics.exporter import serve_metrics

    try:
        return serve_metrics(args.target, args.listen, args.cgroup, args.interval_ms)
    except (AgentError, OSError) as e:
        print(f"guestctl: metrics: {e}", file=sys.stderr)
        return 1


COMMANDS = {
    "metrics": Command(
        "serve the memory report to Prometheus, fed by WatchMemory",
        _metrics_arguments,
        _metrics,
    ),
}
