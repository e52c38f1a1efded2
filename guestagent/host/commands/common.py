"""What every guestctl command shares: its shape (flags and a run), the value types its flags
take, the wrapper of the commands that call the agent, and the one way an answer is printed."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from guestagent.errors import AgentError
from guestagent.host.client import AgentClient, describe_error
from guestagent.host.display import as_json
from guestagent.host.units import parse_limit, parse_size
from guestagent.transport.address import TcpAddress, parse_address

Run = Callable[[argparse.Namespace], int]
Call = Callable[[AgentClient, argparse.Namespace], str]
AddArguments = Callable[[argparse.ArgumentParser], None]
Message = TypeVar("Message")


class UsageError(Exception):
    """A command line argparse accepted but the command cannot run with; exit 2 like argparse."""


@dataclass(frozen=True)
class Command:
    help: str
    add_arguments: AddArguments
    run: Run


def shown(args: argparse.Namespace, message: Message, text: Callable[[Message], str]) -> str:
    """An answer as the command prints it: protobuf JSON with --json, else its text."""
    return as_json(message) if args.json else text(message)


def remote(call: Call) -> Run:
    """A command that talks to the agent at --target: it prints what the call returns, and a
    failed call is one line on stderr and exit status 1."""

    def run(args: argparse.Namespace) -> int:
        need_target(args)
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


def need_target(args: argparse.Namespace) -> None:
    if args.target is None:
        raise UsageError(f"{args.command} needs --target")


def missing_extra(command: str, module: str, extra: str) -> bool:
    """True, after saying what to install, when an optional host dependency is absent."""
    top = module.split(".")[0]
    if importlib.util.find_spec(top) is not None and importlib.util.find_spec(module) is not None:
        return False
    print(f"guestctl: {command} needs {module}: pip install 'guestagent[{extra}]'", file=sys.stderr)
    return True


def size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def limit(text: str) -> int:
    try:
        return parse_limit(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def count(text: str) -> int:
    """A whole number >= 0 (milliseconds): a negative one would reach protobuf's unsigned
    fields as a traceback."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def counts(text: str) -> list[int]:
    return [count(item) for item in text.split(",")]


def seconds(text: str) -> float:
    """A finite number of seconds above 0 (nan and inf would never time out)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: seconds must be finite and above 0")
    return value


def share(text: str) -> float:
    """A share in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value} is not in (0, 1]")
    return value


def listen_address(text: str) -> TcpAddress:
    try:
        address = parse_address(f"tcp://{text}")
    except AgentError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT: {e}") from None
    if not isinstance(address, TcpAddress):  # Not an assert: python -O strips those.
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return address


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """The command takes no flags of its own."""


def cold_after_argument(parser: argparse.ArgumentParser) -> None:
    """One name, as the contract's cold_after_ms; `--cold-after` was info's and watch's
    spelling before, and scripts may still use it."""
    for flag, visible in (("--cold-after-ms", True), ("--cold-after", False)):
        parser.add_argument(
            flag,
            dest="cold_after_ms",
            type=count,
            default=0,
            metavar="MS",
            help="idle age from which memory counts as cold (default 0: the agent's 60000)"
            if visible
            else argparse.SUPPRESS,
        )


def json_or_text(args: argparse.Namespace, document: dict[str, Any], text: str) -> str:
    """A host-side result (not a protobuf message) as printed: indented JSON, or its text."""
    return json.dumps(document, indent=2) if args.json else text
