"""The hostile-input suite: the real daemon on a fake tree, under the limits a real service
has (a soft and hard RLIMIT_NOFILE of 1024, systemd's default, and the host's own inotify
max_user_instances), fed what a hostile or buggy host runtime would send (issue 25)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.agentproc import AgentProcess
from tests.fakes.root import FakeRoot

NOFILE = 1024
# The service's limits: prlimit sets soft and hard, so raising soft to hard gains nothing.
LIMITED = ("prlimit", f"--nofile={NOFILE}:{NOFILE}", "--")


def agent_fds(pid: int) -> list[str]:
    directory = Path(f"/proc/{pid}/fd")
    links = []
    for entry in os.listdir(directory):
        try:
            links.append(os.readlink(directory / entry))
        except FileNotFoundError:
            continue
    return links


def limited_agent(root: Path, workdir: Path, *extra: str) -> AgentProcess:
    assert shutil.which("prlimit"), "util-linux prlimit is needed"
    return AgentProcess(root, workdir, extra_args=extra, wrapper=LIMITED)


@pytest.fixture
def hostile(fake_root: FakeRoot, tmp_path: Path) -> Iterator[AgentProcess]:
    fake_root.add_cgroup("pod/ctr")
    (fake_root.root / "sys/fs/cgroup/pod/ctr/memory.reclaim").write_text("")
    process = limited_agent(fake_root.root, tmp_path)
    process.start()
    yield process
    process.kill()
