"""matplotlib for the bench's plots, when the bench extra is installed: one way to load it
headless and one way to write a figure beside the JSON."""

from __future__ import annotations

from collections.abc import Sequence
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


def rss_timelines(
    lines: Sequence[tuple[str, list[tuple[float, float]]]],
    path: Path,
    title: str,
    xlabel: str = "seconds from the action",
    marks: Sequence[float] = (),
) -> str:
    """QEMU's RSS (less TCG's code) over time, one (label, [(t, MiB)]) line each, on one time
    axis with 0 at the action (dotted) and any marks (dashed); the PNG's path, or NOT_DRAWN."""
    plt = pyplot()
    if plt is None:
        return NOT_DRAWN
    figure, axis = plt.subplots(figsize=(9, 4.5))
    for label, rows in lines:
        axis.plot([t for t, _ in rows], [rss for _, rss in rows], label=label)
    axis.axvline(0, color="grey", linestyle=":")
    for mark in marks:
        axis.axvline(mark, color="grey", linestyle="--")
    axis.set_xlabel(xlabel)
    axis.set_ylabel("QEMU RSS less TCG code (MiB)")
    axis.set_title(title)
    axis.legend(loc="upper right")
    return save(plt, figure, path)
