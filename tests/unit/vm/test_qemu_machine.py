"""The harness boots an aarch64 guest on arm's virt board and refuses what that board lacks.
No VM is started: these read the QEMU command line."""

from pathlib import Path

import pytest

from guestagent.host.sizing.boot import VirtioMem, VMConfig, qemu_version
from guestagent.vm.qemu import GuestVM
from tests.fakes.qemu_command import command_line, option


@pytest.fixture(autouse=True)
def no_kvm_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GUESTAGENT_ACCEL", "tcg")


def test_aarch64_boots_on_virt_with_its_console_and_cpu(tmp_path: Path) -> None:
    argv = command_line(VMConfig(arch="aarch64"), tmp_path)
    assert argv[0] == "qemu-system-aarch64" and option(argv, "-M") == ["virt"]
    # Another architecture's guest is emulated whatever GUESTAGENT_ACCEL says.
    assert option(argv, "-accel") == ["tcg"] and option(argv, "-cpu") == ["max,pauth-impdef=on"]
    (append,) = option(argv, "-append")
    assert "console=ttyAMA0" in append.split()
    devices = option(argv, "-device")
    assert any(
        d.startswith("virtio-balloon-pci,") and "free-page-reporting=on" in d for d in devices
    )
    assert any(d.startswith("virtio-blk-pci,drive=root") for d in devices)


def test_x86_64_is_unchanged(tmp_path: Path) -> None:
    argv = command_line(VMConfig(), tmp_path)
    assert argv[0] == "qemu-system-x86_64" and option(argv, "-M") == []
    assert option(argv, "-cpu") == ["max"]
    (append,) = option(argv, "-append")
    assert "console=ttyS0" in append.split()


def test_dimm_slots_are_refused_on_virt(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no pc-dimm slots"):
        GuestVM(VMConfig(arch="aarch64", slots=2), image_dir=tmp_path, workdir=tmp_path)


def test_unknown_arch_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown arch 'riscv64'"):
        GuestVM(VMConfig(arch="riscv64"), image_dir=tmp_path, workdir=tmp_path)


def test_virtio_mem_needs_a_qemu_that_has_it_on_virt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("guestagent.host.sizing.boot.installed_qemu_version", lambda arch: (7, 2))
    config = VMConfig(arch="aarch64", virtio_mem=VirtioMem(max_mib=256))
    with pytest.raises(ValueError, match="older than virtio-mem"):
        command_line(config, tmp_path)


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)\n", (7, 2)),
        ("QEMU emulator version 10.1.0\nCopyright", (10, 1)),
    ],
)
def test_qemu_version(text: str, version: tuple[int, int]) -> None:
    assert qemu_version(text) == version


def test_tcgs_translation_cache_can_be_capped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GUESTAGENT_ACCEL", "tcg")
    argv = command_line(VMConfig(tcg_tb_mib=64), tmp_path)
    assert option(argv, "-accel") == ["tcg,tb-size=64"]
    assert option(command_line(VMConfig(), tmp_path), "-accel") == ["tcg"]


def test_qemu_starts_in_the_host_cgroup_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell moves itself into the cgroup and becomes QEMU: every page is charged there."""
    cgroup = tmp_path / "pod"
    cgroup.mkdir()
    for directory in ("image", "vm"):
        (tmp_path / directory).mkdir()
    config = VMConfig(host_cgroup=str(cgroup))
    vm = GuestVM(config, image_dir=tmp_path / "image", workdir=tmp_path / "vm")
    started: list[list[str]] = []

    def popen(argv: list[str], **options: object) -> None:
        started.append(argv)

    monkeypatch.setattr("subprocess.Popen", popen)
    vm.start(wait=False)
    (argv,) = started
    assert argv[:2] == ["sh", "-c"] and f"echo $$ > {cgroup}/cgroup.procs" in argv[2]
    assert argv[3] == "qemu" and argv[4].startswith("qemu-system")
