from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.agentproc import AgentProcess
from tests.fakes.root import FakeRoot


@pytest.fixture
def agent(fake_root: FakeRoot, tmp_path: Path) -> Iterator[AgentProcess]:
    fake_root.add_cgroup("pod/ctr")
    process = AgentProcess(fake_root.root, tmp_path)
    process.start()
    yield process
    process.kill()
