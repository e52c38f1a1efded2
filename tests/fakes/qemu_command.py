"""The QEMU command line the harness would run, read without starting QEMU, for the tests
of machines and image flavours."""

from __future__ import annotations

from pathlib import Path

from guestagent.host.sizing.boot import VMConfig
from guestagent.vm.qemu import GuestVM


def command_line(config: VMConfig, tmp_path: Path) -> list[str]:
    vm = GuestVM(config, image_dir=tmp_path / "image", workdir=tmp_path / "vm")
    return vm._command_line()


def option(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == name]
