"""The programs the agent runs, and the one place that finds them.

Every external program goes through tool_path, so where the agent looks for its tools is
decided once: its own runtime's sbin/ first (the bundle and the Kata extension carry
util-linux's mkswap and blkid, built for their own loader), then PATH, where the agent runs
from a development venv or a guest supplies them.
"""

from __future__ import annotations

import os
import subprocess
import sys

from guestagent.errors import FailedPrecondition
from guestagent.linux.blockdev import SWAP_SIGNATURE


class ToolMissing(FailedPrecondition):
    """A program the agent needs is not installed where it looks."""

    default_reason = "TOOL_MISSING"


def own_tool(name: str, prefix: str | None = None) -> str | None:
    """The runtime's own copy of a tool, beside its interpreter."""
    path = os.path.join(sys.prefix if prefix is None else prefix, "sbin", name)
    return path if os.access(path, os.X_OK) else None


def tool_path(name: str) -> str:
    """The executable to run for a tool; ToolMissing, naming it, when there is none."""
    import shutil  # Here, not at start: the daemon's start loads no shutil.

    path = own_tool(name) or shutil.which(name)
    if path is None:
        raise ToolMissing(
            f"{name} is not installed (looked for it in {sys.prefix}/sbin and on PATH)"
        )
    return path


def blkid_signatures(devnode: str) -> list[str]:
    """A second opinion from libblkid's low-level probe, where blkid is installed."""
    try:
        command = [tool_path("blkid"), "-p", "-o", "export", devnode]
    except ToolMissing:
        return []
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if result.returncode == 2:  # Nothing found.
        return []
    return blkid_found(result.stdout)


def blkid_found(export: str) -> list[str]:
    """What `blkid -p -o export` found: a filesystem or swap (TYPE), a partition table."""
    values = dict(line.partition("=")[::2] for line in export.splitlines())
    found = []
    if "TYPE" in values:
        found.append(SWAP_SIGNATURE if values["TYPE"] == "swap" else values["TYPE"])
    if "PTTYPE" in values:
        found.append(f"{values['PTTYPE']} partition table")
    return found


def run_mkswap(devnode: str, uuid: str, label: str, force: bool) -> None:
    command = [
        tool_path("mkswap"),
        "-L",
        label,
        "-U",
        uuid,
        *(["-f"] if force else []),
        devnode,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(
            f"mkswap exited {result.returncode}: {(result.stderr or result.stdout).strip()}"
        )
