"""`guestctl`: the host-side command line, talking to a guest's agent or sizing VMs.

Each subcommand is a `Command` of guestagent/host/commands/: the flags it adds and what runs
it. This module assembles them into one parser and runs the one asked for; `python -m
guestagent.host.ctl` is guestctl too.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from guestagent.help_formatter import help_formatter
from guestagent.host.commands import agent, giveback, metrics, node, sizing
from guestagent.host.commands.common import Command, Run, UsageError, seconds
from guestagent.host.units import SIZE_HELP

GROUPS = agent.GROUPS
GROUP_ARGUMENTS = agent.GROUP_ARGUMENTS
COMMANDS: dict[str, Command] = {
    **agent.COMMANDS,
    **sizing.COMMANDS,
    **giveback.COMMANDS,
    **metrics.COMMANDS,
    **node.COMMANDS,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="guestctl",
        description="talk to a guest's agent",
        epilog=f"Sizes: {SIZE_HELP}.",
        formatter_class=help_formatter,
    )
    parser.add_argument(
        "--target",
        help="vsock://CID:PORT, hvsock:///path/vsock.sock:PORT, unix:///PATH or tcp://HOST:PORT "
        "(every command but plan and measure-overhead needs one)",
    )
    parser.add_argument("--json", action="store_true", help="print protobuf JSON")
    parser.add_argument(
        "--timeout",
        type=seconds,
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
                group_parser = commands.add_parser(
                    group, help=GROUPS[group], formatter_class=help_formatter
                )
                if group in GROUP_ARGUMENTS:
                    GROUP_ARGUMENTS[group](group_parser)
                groups[group] = group_parser.add_subparsers(
                    dest=f"{group}_command", required=group not in GROUP_ARGUMENTS
                )
            subparser = groups[group].add_parser(
                sub, help=command.help, formatter_class=help_formatter
            )
        else:
            subparser = commands.add_parser(name, help=command.help, formatter_class=help_formatter)
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


if __name__ == "__main__":
    sys.exit(main())
