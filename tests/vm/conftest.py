"""Fixtures for tests that boot the guest image under QEMU (build it with `make -C image`)."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.vm.qemu import DEFAULT_IMAGE_DIR, GuestVM
from tests.vm import pace as pacing
from tests.vm.guest import boot

IMAGE_FILES = ("vmlinuz", "initrd.img", "rootfs.img")
SWAP_DISK = Disk("swap", 1 << 30, serial="swap0")
DATA_DISK = Disk("data", 64 << 20, serial="data0")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vm: boots the guest image under QEMU")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how slow the guests were, so a log of a failure shows whether the host was busy."""
    if pacing.MEASURED:
        paces = ", ".join(f"{p.factor:g}x ({p.probe_seconds:g} s)" for p in pacing.MEASURED)
        terminalreporter.write_line(f"guest pace per boot, against an idle host: {paces}")


@pytest.fixture(scope="session")
def image() -> Path:
    """The image directory; VM tests skip without an image unless GUESTAGENT_VM_TESTS=required."""
    return image_or_skip(Path(os.environ.get("GUESTAGENT_IMAGE_DIR", DEFAULT_IMAGE_DIR)))


def image_or_skip(image_dir: Path) -> Path:
    """image_dir if it holds a bootable image; else skip, or fail when VM tests are required."""
    missing = [name for name in IMAGE_FILES if not (image_dir / name).is_file()]
    if missing:
        reason = f"guest image incomplete: no {', '.join(missing)} in {image_dir} (make -C image)"
        if os.environ.get("GUESTAGENT_VM_TESTS") == "required":
            pytest.fail(reason)
        pytest.skip(reason)
    return image_dir


@pytest.fixture(scope="session")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    """One guest shared by the modules that only read or make their own cgroups; modules
    that change devices (test_swap) boot their own."""
    yield from boot(
        VMConfig(slots=4, maxmem_mib=2048, disks=(SWAP_DISK, DATA_DISK)), image, tmp_path_factory
    )


@pytest.fixture(scope="module")
def pace(vm: GuestVM) -> pacing.Pace:
    """How much slower than on an idle host this module's guest runs; deadlines scale by it."""
    return pacing.of(vm)


@pytest.fixture(scope="module")
def agent(vm: GuestVM, pace: pacing.Pace) -> Iterator[AgentClient]:
    """A client of the agent in whichever guest the module boots (its own `vm` or this one's)."""
    with AgentClient(vm.agent_target, timeout=pace.scale(300)) as client:
        client.wait_ready(pace.scale(60))
        yield client
