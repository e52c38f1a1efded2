"""The harness boots each image flavour with its own root disk and PID 1, and refuses
settings a flavour would ignore. No VM is started: these read the QEMU command line."""

from pathlib import Path

import pytest

from guestagent.host.sizing.boot import FLAVOURS, VMConfig
from guestagent.vm.qemu import GuestVM
from tests.fakes.qemu_command import command_line, option


@pytest.fixture(autouse=True)
def no_kvm_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GUESTAGENT_ACCEL", "tcg")


def test_fast_flavour_boots_the_shell_init_with_agent_args(tmp_path: Path) -> None:
    argv = command_line(VMConfig(agent_args=("--allow-cid", "1")), tmp_path)
    (append,) = option(argv, "-append")
    assert "init=/sbin/guestagent-init" in append.split()
    assert "guestagent.listen=vsock://:6464,tcp://0.0.0.0:6464" in append.split()
    assert "guestagent.args=--allow-cid,1" in append.split()
    assert any(f"file={tmp_path}/image/rootfs.img," in d for d in option(argv, "-drive"))


def test_systemd_flavour_boots_systemd_from_its_own_root_disk(tmp_path: Path) -> None:
    argv = command_line(VMConfig(flavour="systemd", extra_cmdline="x=1"), tmp_path)
    (append,) = option(argv, "-append")
    words = append.split()
    assert "init=/lib/systemd/systemd" in words and "x=1" in words
    assert "guestagent.testexec=1" in words
    assert not [w for w in words if w.startswith(("guestagent.listen=", "guestagent.args="))]
    drives = option(argv, "-drive")
    assert any(f"file={tmp_path}/image/rootfs-systemd.img," in d for d in drives)
    assert not any("/rootfs.img," in d for d in drives)


def test_each_flavour_has_its_own_root_disk() -> None:
    assert len({f.rootfs for f in FLAVOURS.values()}) == len(FLAVOURS)


def test_unknown_flavour_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown image flavour 'alpine'; known: fast, systemd"):
        GuestVM(VMConfig(flavour="alpine"), image_dir=tmp_path, workdir=tmp_path)


@pytest.mark.parametrize(
    "config",
    [
        VMConfig(flavour="systemd", agent_args=("--allow-cid", "1")),
        VMConfig(flavour="systemd", listen="vsock://:7000"),
    ],
)
def test_systemd_flavour_refuses_agent_args_it_would_ignore(
    config: VMConfig, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="/etc/default/guestagent"):
        GuestVM(config, image_dir=tmp_path, workdir=tmp_path)
