"""Fixtures for tests that boot the guest image under QEMU (build it with `make -C image`)."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestagent.host.client import AgentClient
from guestagent.vm.qemu import DEFAULT_IMAGE_DIR, Disk, GuestVM, VMConfig
from tests.vm.guest import boot

IMAGE_FILES = ("vmlinuz", "initrd.img", "rootfs.img")
SWAP_DISK = Disk("swap", 1 << 30, serial="swap0")
DATA_DISK = Disk("data", 64 << 20, serial="data0")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vm: boots the guest image under QEMU")


@pytest.fixture(scope="session")
def image() -> Path:
    """The image directory; VM tests skip without an image unless GUESTAGENT_VM_TESTS=required."""
    image_dir = Path(os.environ.get("GUESTAGENT_IMAGE_DIR", DEFAULT_IMAGE_DIR))
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
def agent(vm: GuestVM) -> Iterator[AgentClient]:
    """A client of the agent in whichever guest the module boots (its own `vm` or this one's)."""
    with AgentClient(vm.agent_target, timeout=300) as client:
        client.wait_ready(60)
        yield client
