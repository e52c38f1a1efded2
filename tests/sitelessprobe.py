"""A fresh interpreter started as the agent's is, without `site`: what a probe finds loaded is
what the agent would load. With site, the editable install's .pth finder imports pathlib
(and through it urllib.parse and ipaddress) before the probe's first line runs."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def siteless_command(probe: str, *args: str) -> list[str]:
    """The interpreter's command for `probe` and its argv, with this process's import path."""
    paths = [str(REPO), *(p for p in sys.path if p)]
    return [sys.executable, "-S", "-c", f"import sys\nsys.path[:] = {paths!r}\n{probe}", *args]
