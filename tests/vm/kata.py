"""The Kata-like guest (image/kata/) with the agent's extension image attached: what the tests
that boot it share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestagent.build.extension import VerityParams
from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import ReadOnlyDisk, VMConfig
from guestagent.vm.qemu import GuestVM

# The test build of the extension: components.toml and the operator unit also admit vsock
# loopback peers (CID 1), through which the guest's socat relay reaches the agent.
EXTENSION = "guestagent-extension-test.img"
SERIAL = "extension-guestagent"
# A trixie systemd boot to serving under TCG on the 2-core test host, with room.
BOOT_SECONDS = 240.0
MOUNTED = "kata-extension-mount: guestagent: mounted at /run/kata-extensions/guestagent"


def extension_disk(image: Path) -> ReadOnlyDisk:
    params = VerityParams.parse(image.with_suffix(".verity-params").read_text())
    return ReadOnlyDisk(image, SERIAL, f"kata.extension.guestagent.verity_params={params}")


def extension_image_path(image_dir: Path) -> Path:
    """The test extension in image_dir; the test fails without it or the guest's root."""
    path = image_dir / EXTENSION
    if not (path.is_file() and (image_dir / "rootfs-kata.img").is_file()):
        pytest.fail(f"no {path} or rootfs-kata.img: make image builds them")
    return path


@contextlib.contextmanager
def booted(config: VMConfig, image_dir: Path, workdir: Path) -> Iterator[GuestVM]:
    with GuestVM(config, image_dir=image_dir, workdir=workdir, boot_timeout=BOOT_SECONDS) as vm:
        yield vm


@contextlib.contextmanager
def serving(vm: GuestVM) -> Iterator[AgentClient]:
    """A client of the guest's agent, once it answers (through the guest's tcp relay)."""
    with AgentClient(vm.agent_target, timeout=120) as client:
        client.wait_ready(60)
        yield client
