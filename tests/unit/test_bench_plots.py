"""The bench's RSS plots draw from their figures (one helper: give-back and node sections)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench import giveback, giveback_follow, node_guests
from tests.bench.plotting import NOT_DRAWN, pyplot

TIMELINE = [(-5.0, 900.0), (0.0, 900.0), (30.0, 500.0)]

pytestmark = pytest.mark.skipif(pyplot() is None, reason="needs the bench extra (matplotlib)")


def test_the_give_back_plot_is_drawn(tmp_path: Path) -> None:
    side = {"returned_mib": 400, "rss_timeline": TIMELINE}
    figures = {"reclaimer_alone": side, "give_back_safe": side}
    out = giveback.plot(figures, tmp_path / "giveback.png")
    assert out != NOT_DRAWN and Path(out).stat().st_size > 0


def test_the_follow_plot_is_drawn_with_its_mark(tmp_path: Path) -> None:
    figures = {side: {"oom_kills": 0, "rss_timeline": TIMELINE} for side, _ in giveback_follow.ARMS}
    figures["follow"]["grow_at_s"] = 20.0
    out = giveback_follow.plot(figures, tmp_path / "follow.png")
    assert out != NOT_DRAWN and Path(out).stat().st_size > 0


def test_the_node_plot_is_drawn_from_both_arms(tmp_path: Path) -> None:
    kills = {name: 0 for name in node_guests.GUESTS}
    figures = {side: {"oom_kills": kills, "rss_timeline": TIMELINE} for side, _ in node_guests.ARMS}
    out = node_guests.plot(figures, tmp_path / "node.png")
    assert out != NOT_DRAWN and Path(out).stat().st_size > 0
