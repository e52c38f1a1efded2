"""The hog ends by itself: after its time, and when its parent dies."""

from __future__ import annotations

import os
import subprocess
import sys
import time

HOG = [sys.executable, "-m", "tests.stress.cpuhog"]


def test_it_stops_when_its_time_is_up() -> None:
    done = subprocess.run([*HOG, "--seconds", "0.5"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "time is up" in done.stderr


def test_it_stops_when_its_parent_dies() -> None:
    # The shell starts the hog (off the captured pipe), prints its pid, and exits, maybe
    # before the hog is up: --parent tells it whose child it was meant to be.
    shell = subprocess.run(
        ["sh", "-c", f"{' '.join(HOG)} --seconds 120 --parent $$ >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    pid = int(shell.stdout)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and not _zombie(pid):
        assert time.monotonic() < deadline, f"hog {pid} still running after its parent exited"
        time.sleep(0.1)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_bad_seconds_are_refused() -> None:
    done = subprocess.run([*HOG, "--seconds", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--seconds must be positive, not 0.0" in done.stderr
