"""matplotlib for the bench's plots, when the bench extra is installed: one way to load it
headless and one way to write a figure beside the JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

NOT_DRAWN = "not drawn: pip install 'guestagent[bench]' for matplotlib"


def pyplot() -> Any | None:
    """matplotlib.pyplot on the Agg backend (no display), or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save(plt: Any, figure: Any, path: Path) -> str:
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return str(path)
