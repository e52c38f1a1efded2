from pathlib import Path

import pytest

from tests.fakeroot import FakeRoot, make_fake_root


@pytest.fixture
def fake_root(tmp_path: Path) -> FakeRoot:
    return make_fake_root(tmp_path / "root")
