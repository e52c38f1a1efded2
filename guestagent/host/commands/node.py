"""`guestctl node`: the node daemon, one per host (docs/node.md): it finds every sandbox VM the
runtimes started and drives each guest's agent, until SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from types import FrameType
from typing import TYPE_CHECKING

from guestagent.errors import AgentError
from guestagent.host.commands.common import Command, listen_address

if TYPE_CHECKING:
    from guestagent.host.node.daemon import Families, ServeMetrics

DEFAULT_CONFIG = "/etc/guestagent/node.toml"
MALLOC_ARENAS = 2


def _node_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        help=f"the node's policy, TOML (default {DEFAULT_CONFIG} if it exists, else the "
        "defaults docs/node.md lists)",
    )
    parser.add_argument(
        "--root", help="prefixed to the runtimes' paths (a container mounts the host's under it)"
    )
    parser.add_argument("--declared", help="a file of VMs no runtime manages ([[vm]] tables)")
    parser.add_argument(
        "--listen", type=listen_address, metavar="HOST:PORT", help="serve /metrics here"
    )
    parser.add_argument("--cri-socket", help="CRI's socket, for pod names (unix:///path)")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the JSON log lines on stderr from this level (default info)",
    )


def _policy_text(path: str | None) -> tuple[str, str]:
    """(the policy's text, where it came from); the default file may be absent."""
    chosen = path or DEFAULT_CONFIG
    try:
        with open(chosen) as policy:
            return policy.read(), chosen
    except FileNotFoundError:
        if path is None:
            return "", "the defaults"
        raise


def _node(args: argparse.Namespace) -> int:
    """Exit 0 on SIGTERM, 2 on a policy it cannot run with, 1 when /metrics cannot listen."""
    from guestagent import jsonlog
    from guestagent.host.node.config import ConfigError, parse_policy
    from guestagent.host.node.daemon import NodeDaemon
    from guestagent.linux.syscalls import limit_malloc_arenas, refuse_huge_pages

    # As the agent does (agent/cli.py): two malloc arenas, not 8 per core, for a loop's thread
    # per VM, and no transparent huge pages for a heap that is mostly small objects.
    limit_malloc_arenas(MALLOC_ARENAS)
    refuse_huge_pages()
    jsonlog.configure(args.log_level)
    try:
        text, where = _policy_text(args.config)
        policy = parse_policy(text, where)
    except (OSError, ConfigError) as e:
        print(f"guestctl: node: {e}", file=sys.stderr)
        return 2
    discovery, metrics = policy.discovery, policy.metrics
    if args.root is not None:
        discovery = replace(discovery, root=args.root)
    if args.declared is not None:
        discovery = replace(discovery, declared=args.declared)
    if args.listen is not None:
        metrics = replace(metrics, listen=f"{args.listen.host}:{args.listen.port}")
    if args.cri_socket is not None:
        metrics = replace(metrics, cri_socket=args.cri_socket)
    policy = replace(policy, discovery=discovery, metrics=metrics)
    try:
        daemon = NodeDaemon(policy)
    except (AgentError, OSError, ValueError) as e:
        print(f"guestctl: node: {e}", file=sys.stderr)
        return 1

    def stop(signum: int, frame: FrameType | None) -> None:
        daemon.stopping.set()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return daemon.run(_metrics_server(metrics.listen))
    except OSError as e:  # /metrics could not listen.
        print(f"guestctl: node: {e}", file=sys.stderr)
        return 1
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _metrics_server(listen: str) -> ServeMetrics:
    """How the daemon serves its families: /metrics at `listen`, or nowhere when empty."""
    from guestagent.host.metrics.server import serve_in_background
    from guestagent.jsonlog import EventLog

    def serve(build: Families) -> Callable[[], None]:
        if not listen:
            return lambda: None

        def announce(url: str, what: str) -> None:  # A JSON line, as every other of the node.
            EventLog("guestagent.node").info("metrics_serving", url=url)

        server = serve_in_background(listen_address(listen), build, announce)

        def stop() -> None:
            server.shutdown()
            server.server_close()

        return stop

    return serve


COMMANDS = {
    "node": Command(
        "the node daemon: find every sandbox VM on this host and drive its guest's agent",
        _node_arguments,
        _node,
    ),
}
