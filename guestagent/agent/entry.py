"""The `guestagent` command's entry point, in a module of its own so that what the process
refuses or defers is in place before any of the agent's imports: the daemon's bring asyncio,
which imports ssl when it can, and protobuf, which imports its pure-Python implementation.
"""

from __future__ import annotations

import sys

from guestagent.load_on_use import LOADED_ON_USE, load_on_use


def entry() -> int:
    """`guestagent`: the command line's command, in a process that never loads ssl and runs
    none of the modules load_on_use defers. No listener speaks TLS, but asyncio imports ssl
    when it can (about 4 MiB of RSS in every guest); a None in sys.modules makes that import
    fail the way asyncio expects."""
    sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]
    load_on_use(LOADED_ON_USE)
    from guestagent.agent import cli  # Only now: see the module's docstring.

    return cli.command(sys.argv[1:])
