"""What `make` builds for the integration tests of built artifacts (the bundle, the node
image): a missing one skips its tests, or fails them where the build is required."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def built(path: Path, how: str) -> Path:
    if not path.exists():
        if os.environ.get("GUESTAGENT_VM_TESTS") == "required":
            pytest.fail(f"{path} is missing: `{how}` builds it")
        pytest.skip(f"{path} is missing: `{how}` builds it")
    return path
