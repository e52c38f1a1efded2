"""A bounded CPU hog: one process that keeps one core busy, for `make vm-stress`.

It ends by itself after --seconds, or as soon as its parent dies (the kernel sends it SIGTERM
through PR_SET_PDEATHSIG, and it checks its parent pid too in case the parent died first),
so an interrupted run never leaves it spinning. --parent names the process it belongs to
(by default whoever started it), for a shell that may exit before the hog is up:

    python -m tests.stress.cpuhog --seconds 3600 --parent $$ &
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1
# How often the spin loop looks at the clock and its parent: short enough to end promptly.
CHECK_EVERY_S = 0.2


def die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def spin(seconds: float, parent: int) -> str:
    """Burn CPU until `seconds` have passed or the parent is gone; returns why it stopped."""
    end = time.monotonic() + seconds
    while True:
        slice_end = time.monotonic() + CHECK_EVERY_S
        while time.monotonic() < slice_end:
            pass
        if time.monotonic() >= end:
            return "time is up"
        if os.getppid() != parent:
            return "parent gone"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, required=True, help="stop after this long")
    parser.add_argument("--parent", type=int, help="stop when this pid is no longer the parent")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error(f"--seconds must be positive, not {args.seconds}")
    parent = args.parent or os.getppid()
    die_with_parent()
    # The parent may have died before prctl took effect; then it was re-parented already.
    if os.getppid() != parent:
        print(f"cpuhog: parent {parent} gone before the start", file=sys.stderr)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    started = time.monotonic()
    why = spin(args.seconds, parent)
    print(f"cpuhog: stopped after {time.monotonic() - started:.0f} s: {why}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
