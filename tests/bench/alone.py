"""One bench section run alone (`python -m tests.bench.<section>`): its --out, and its
figures written there as JSON and printed; a plot, where it draws one, goes beside it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

RESULTS = Path("tests/bench/results")


def parser(description: str | None, section: str) -> argparse.ArgumentParser:
    arguments = argparse.ArgumentParser(description=description)
    arguments.add_argument(
        "--out",
        type=Path,
        default=RESULTS / f"{section}.json",
        help=f"the figures as JSON, a plot beside it as .png (default {RESULTS}/{section}.json)",
    )
    return arguments


def write(out: Path, figures: dict[str, Any]) -> int:
    """Write and print the figures; the exit status, 0."""
    text = json.dumps(figures, indent=2)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(text)
    return 0
