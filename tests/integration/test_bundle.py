"""The built bundle as an operator receives it: every ELF file in it loads only from it, and
the agent it carries runs in a root holding nothing else (no shell, no libc) and answers.

Needs the bundle (`make bundle`, or `make test`, which builds it); root, for chroot.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import shutil
import subprocess
import sys
import tarfile
import time
import types
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from guestagent.build.runtime import check
from guestagent.host.client import AgentClient
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.root import make_fake_root
from tests.integration.artifacts import built

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "image" / "build" / "guestagent-bundle.tar.xz"
# `make bundle ARCH=arm64` (or `make image-arm64`, which `make test` runs) builds it.
AARCH64_BUNDLE = REPO / "image" / "build" / "arm64" / "guestagent-bundle.tar.xz"
PREFIX = PurePosixPath("/opt/guestagent")
RESULTS = REPO / "tests" / "vm" / "results"
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


@pytest.fixture(scope="module")
def bundle() -> Path:
    return built(BUNDLE, "make bundle")


def unpack(bundle: Path, root: Path) -> Path:
    with tarfile.open(bundle) as archive:
        archive.extractall(root, filter="tar")
    return root


@pytest.fixture(scope="module")
def unpacked(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(bundle, tmp_path_factory.mktemp("bare"))


def elf_check(unpacked: Path, machine: str, loader: str, saved_as: str) -> None:
    lines, problems = check(unpacked / PREFIX.relative_to("/"), PREFIX, machine)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / saved_as).write_text("\n".join(lines) + "\n")
    print(f"ELF check ({machine}), {len(lines)} files:", *lines, sep="\n  ")
    assert problems == []
    executables = [line for line in lines if line.startswith("exec")]
    # The interpreter and the tools the agent runs, each on the tree's own loader.
    assert {line.split()[1] for line in executables} == {
        "/opt/guestagent/bin/python3.11",
        "/opt/guestagent/sbin/mkswap",
        "/opt/guestagent/sbin/blkid",
    }
    assert all(f"loader=/opt/guestagent/lib/{loader}" in line for line in executables)


def test_every_elf_file_loads_from_the_tree(unpacked: Path) -> None:
    elf_check(unpacked, "x86_64", "ld-linux-x86-64.so.2", "elf-check.txt")


def test_every_elf_file_of_the_aarch64_bundle_is_aarch64_and_loads_from_it(
    tmp_path: Path,
) -> None:
    root = unpack(built(AARCH64_BUNDLE, "make bundle ARCH=arm64"), tmp_path)
    elf_check(root, "aarch64", "ld-linux-aarch64.so.1", "elf-check-aarch64.txt")


def test_only_the_guest_side_ships(unpacked: Path) -> None:
    package = unpacked / "opt/guestagent/lib/python3/dist-packages/guestagent"
    assert {"agent", "linux", "ops", "v1"} <= {p.name for p in package.iterdir()}
    assert not {"host", "vm", "build"} & {p.name for p in package.iterdir()}


def code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from code_objects(constant)


def test_no_bytecode_carries_column_positions(unpacked: Path) -> None:
    """compile_tree compiles without PEP 657's column table: the stdlib's sourceless pycs and
    the agent's own both give a line and no column for every instruction."""
    tree = unpacked / PREFIX.relative_to("/")
    pycs = [
        tree / "lib/python3.11/asyncio/base_events.pyc",
        *(tree / "lib/python3/dist-packages/guestagent/agent/__pycache__").glob("*.opt-2.pyc"),
    ]
    assert len(pycs) > 5
    for pyc in pycs:
        # A pyc is a 16-byte header and the marshalled module code.
        codes = list(code_objects(marshal.loads(pyc.read_bytes()[16:])))
        positions = [p for code in codes for p in code.co_positions()]
        assert {column for _, _, column, _ in positions} == {None}, pyc
        assert any(line is not None for line, _, _, _ in positions), pyc


@contextlib.contextmanager
def mounted(source: str, target: Path, *options: str) -> Iterator[None]:
    subprocess.run(["mount", *options, source, str(target)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(target)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot and mounts need root")
def test_the_agent_serves_in_a_root_with_no_shell_and_no_libc(unpacked: Path) -> None:
    root = unpacked
    for directory in ("dev", "proc", "run"):
        (root / directory).mkdir(exist_ok=True)
    # Nothing but /dev, /proc, the bundle and the fake kernel tree the agent is pointed at.
    assert not (root / "bin").exists() and not (root / "usr").exists()
    assert sorted(p.name for p in root.iterdir()) == ["dev", "etc", "opt", "proc", "run"]
    fake = make_fake_root(root / "fake")
    fake.add_cgroup("pod/ctr")
    socket_path = root / "run/agent.sock"
    log = root.parent / "bare-agent.log"
    with (
        mounted("/dev", root / "dev", "--bind"),
        mounted("proc", root / "proc", "-t", "proc"),
        open(log, "wb") as log_file,
    ):
        started = time.monotonic()
        agent = subprocess.Popen(
            [
                CHROOT,
                str(root),
                "/opt/guestagent/bin/guestagent",
                "serve",
                "--root",
                "/fake",
                "--listen",
                "unix:///run/agent.sock",
                "--grace-seconds",
                "2",
            ],
            stderr=log_file,
            env={"PATH": "/nonexistent"},  # nothing of the host's may be found by name
        )
        try:
            deadline = started + 60
            while not socket_path.exists():
                assert agent.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            with AgentClient(f"unix://{socket_path}") as client:
                client.wait_ready(timeout=60)
                info = client.info(["pod/ctr"])
                assert info.system.mem_total_bytes == 498764 * 1024
                assert [c.path for c in info.cgroups] == ["pod/ctr"]
                with pytest.raises(Exception, match="FAILED_PRECONDITION"):
                    client.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="s")))
        finally:
            agent.terminate()
            assert agent.wait(timeout=30) == 0, log.read_text()
    assert "Traceback" not in log.read_text()


@pytest.mark.slow
def test_the_bundle_is_reproducible(bundle: Path, tmp_path: Path) -> None:
    """Same inputs, same bytes: a second build of the bundle equals the one make built."""
    image = REPO / "image"
    build = image / "build"
    wheel = next((REPO / "dist").glob("guestagent-*.whl"))
    output = tmp_path / "again.tar.xz"
    subprocess.run(
        [
            "sh",
            str(image / "scripts/bundle.sh"),
            str(build / "runtime-debs.path"),
            str(build / "deps.path"),
            str(wheel),
            str(image),
            str(output),
        ],
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
    )
    digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (bundle, output)]
    assert digest[0] == digest[1]
    print(f"bundle sha256 {digest[0]} twice", file=sys.stderr)
