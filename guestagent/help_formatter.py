"""argparse's help formatter without shutil, for both command lines (the agent's and
guestctl): argparse makes a formatter for every argument added, and its own width lookup
imports shutil, which brings bz2 and lzma, into every agent and node daemon at start, for
help text nobody reads there."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse


def help_formatter(prog: str) -> argparse.HelpFormatter:
    """argparse's formatter, at the width shutil.get_terminal_size would give (COLUMNS, else
    stdout's terminal, else 80)."""
    columns = os.environ.get("COLUMNS", "")
    if not (columns.isdigit() and int(columns) > 0):
        try:
            columns = str(os.get_terminal_size(sys.__stdout__.fileno()).columns)  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # No stdout, or not a terminal.
            columns = "80"
    import argparse

    return argparse.HelpFormatter(prog, width=int(columns) - 2)
