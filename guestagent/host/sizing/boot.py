"""Boot the guest image under QEMU, wait for its agent and stop it: what guestctl
measure-overhead does to measure a guest, and what the VM test harness (guestagent/vm/qemu.py)
builds on with its command channel into the guest. Only the standard library is needed, plus
qemu.qmp for the QMP methods. The images are where the caller says, or GUESTAGENT_IMAGE_DIR:
an installed package has no checkout to find them in.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from guestagent.host.tls import let_ssl_in
from guestagent.transport.address import DEFAULT_VSOCK_PORT

GUEST_AGENT_PORT = DEFAULT_VSOCK_PORT
IMAGE_DIR_VARIABLE = "GUESTAGENT_IMAGE_DIR"
# HTTP/2 client preface and an empty SETTINGS frame: a gRPC server answers with its SETTINGS.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
HTTP2_SETTINGS_FRAME_TYPE = 4


class GuestVMError(RuntimeError):
    """The VM failed to boot, died, or stopped answering."""


@dataclass(frozen=True)
class Machine:
    """What QEMU emulates for one guest architecture (its `uname -m`), and how."""

    qemu: str
    board: tuple[str, ...]
    console: str
    # The CPU model under TCG; under KVM the host's own.
    tcg_cpu: str
    # Where its image is built, below the image directory (`make -C image ARCH=...`).
    image_subdir: str
    # pc-dimm hot-plug needs ACPI, which a -kernel boot of arm's virt board has not.
    dimm_slots: bool
    # The first QEMU release whose board takes virtio-mem-pci.
    virtio_mem_since: tuple[int, int]


MACHINES = {
    "x86_64": Machine(
        "qemu-system-x86_64", (), "ttyS0", "max", "", dimm_slots=True, virtio_mem_since=(5, 1)
    ),
    # max with pointer authentication's QEMU-defined algorithm: the architected QARMA5 that
    # plain max emulates made the kernel's boot 5x slower under TCG (docs/arm64.md); the rest of
    # max (LSE atomics, hardware access flags, as Graviton and Apple silicon have) stays.
    "aarch64": Machine(
        "qemu-system-aarch64",
        ("-M", "virt"),
        "ttyAMA0",
        "max,pauth-impdef=on",
        "arm64",
        dimm_slots=False,
        virtio_mem_since=(8, 2),
    ),
}


def qemu_version(text: str) -> tuple[int, int]:
    """(major, minor) from `qemu-system-* --version`'s first line."""
    found = re.search(r"version (\d+)\.(\d+)", text)
    if found is None:
        raise GuestVMError(f"no QEMU version in {text[:80]!r}")
    return int(found.group(1)), int(found.group(2))


@functools.cache
def installed_qemu_version(arch: str) -> tuple[int, int]:
    command = [MACHINES[arch].qemu, "--version"]
    return qemu_version(subprocess.run(command, capture_output=True, text=True).stdout)


def image_dir_for(arch: str, base: Path | None = None) -> Path:
    """The image directory of arch's guest: GUESTAGENT_IMAGE_DIR's (x86_64's image), else
    `base`'s, and the architecture's own subdirectory below it."""
    chosen = os.environ.get(IMAGE_DIR_VARIABLE) or base
    if chosen is None:
        raise GuestVMError(
            f"no guest image directory: give one or set {IMAGE_DIR_VARIABLE} "
            "(`make image` writes image/build)"
        )
    return Path(chosen) / MACHINES[arch].image_subdir


@dataclass(frozen=True)
class Disk:
    """An extra virtio-blk disk, backed by a sparse raw file in the VM's directory."""

    name: str
    size_bytes: int
    serial: str | None = None
    discard: bool = True


@dataclass(frozen=True)
class ReadOnlyDisk:
    """A virtio-blk disk backed by an existing image, attached read-only (a Kata guest
    extension, for one), with an optional text for the kernel command line."""

    path: Path
    serial: str
    cmdline: str = ""


@dataclass(frozen=True)
class Flavour:
    """One root disk of the image directory and the PID 1 it boots."""

    rootfs: str
    init: str
    # The fast image's init reads the agent's arguments from the kernel command line; under
    # systemd the unit reads /etc/default/guestagent, as in any guest, so VMConfig cannot set them.
    agent_args_from_cmdline: bool
    # A guest without python has no testexec: it is ready when the agent answers, and
    # exec() is not available.
    testexec: bool = True


FLAVOURS = {
    "fast": Flavour("rootfs.img", "/sbin/guestagent-init", agent_args_from_cmdline=True),
    "systemd": Flavour("rootfs-systemd.img", "/lib/systemd/systemd", agent_args_from_cmdline=False),
    # Debian trixie, no python, the agent started from a Kata guest extension (image/kata/).
    "kata": Flavour(
        "rootfs-kata.img", "/lib/systemd/systemd", agent_args_from_cmdline=False, testexec=False
    ),
}
DEFAULT_LISTEN = f"vsock://:{GUEST_AGENT_PORT},tcp://0.0.0.0:{GUEST_AGENT_PORT}"


@dataclass(frozen=True)
class VirtioMem:
    """A virtio-mem device: a RAM backend of max_mib the host hands to the guest in blocks.

    It starts with nothing plugged (requested-size 0); set_virtio_mem_requested() grows and
    shrinks it. block_mib is the device block, the unit the guest driver plugs and unplugs.
    """

    max_mib: int
    block_mib: int = 2
    id: str = "vmem0"


@dataclass(frozen=True)
class VMConfig:
    flavour: str = "fast"
    memory_mib: int = 512
    cpus: int = 1
    slots: int = 0
    maxmem_mib: int | None = None
    disks: tuple[Disk, ...] = ()
    balloon: bool = True
    free_page_reporting: bool = True
    listen: str = DEFAULT_LISTEN
    agent_args: tuple[str, ...] = ()
    extra_cmdline: str = ""
    virtio_mem: VirtioMem | None = None
    readonly_disks: tuple[ReadOnlyDisk, ...] = ()
    arch: str = "x86_64"
    # TCG's translation cache, in MiB (QEMU's default is 1 GiB): capped where QEMU's own RSS
    # must stay small beside the guest's (a host cgroup's limit that should weigh the guest).
    tcg_tb_mib: int | None = None
    # A host cgroup directory QEMU starts in (its cgroup.procs), as a VMM in a pod's cgroup.
    host_cgroup: str | None = None


def machine_of(config: VMConfig) -> Machine:
    """The config's machine, refusing devices its QEMU board cannot give."""
    try:
        machine = MACHINES[config.arch]
    except KeyError:
        raise ValueError(f"unknown arch {config.arch!r}; known: {', '.join(MACHINES)}") from None
    if config.slots and not machine.dimm_slots:
        raise ValueError(f"{config.arch}: no pc-dimm slots on {machine.qemu} -M virt without ACPI")
    return machine


def flavour_of(config: VMConfig) -> Flavour:
    """The config's flavour, refusing settings that flavour would silently ignore."""
    try:
        flavour = FLAVOURS[config.flavour]
    except KeyError:
        raise ValueError(
            f"unknown image flavour {config.flavour!r}; known: {', '.join(FLAVOURS)}"
        ) from None
    if not flavour.agent_args_from_cmdline and (
        config.listen != DEFAULT_LISTEN or config.agent_args
    ):
        raise ValueError(
            f"the {config.flavour} image takes the agent's arguments from "
            f"/etc/default/guestagent, not listen={config.listen!r} "
            f"agent_args={config.agent_args!r}"
        )
    return flavour


@functools.cache
def accelerator(kernel: Path, arch: str = "x86_64") -> tuple[str, str]:
    """(accel, cpu) for QEMU: KVM only if a probe boot proves it works, else TCG.

    GUESTAGENT_ACCEL=kvm|tcg skips the probe. On nested hosts KVM can be present yet unusable
    (QEMU aborts, or the guest crawls), so the probe boots the kernel to its no-root panic and
    requires that to finish well within the time TCG needs. Another architecture's guest
    always runs under TCG.
    """
    machine = MACHINES[arch]
    tcg = ("tcg", machine.tcg_cpu)
    if arch != platform.machine():
        return tcg
    forced = os.environ.get("GUESTAGENT_ACCEL")
    if forced:
        return (forced, "host") if forced == "kvm" else tcg
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return tcg
    probe = [machine.qemu, *machine.board, "-accel", "kvm", "-cpu", "host", "-m", "128"]
    probe += ["-nodefaults"]
    probe += ["-display", "none", "-no-reboot", "-serial", "null"]
    probe += ["-kernel", str(kernel), "-append", "panic=-1"]
    try:
        works = subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        works = False
    return ("kvm", "host") if works else tcg


def free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def virtio_mem_options(device: VirtioMem) -> list[tuple[str, str]]:
    backend = f"memory-backend-ram,id={device.id}-ram,size={device.max_mib}M"
    pci = (
        f"virtio-mem-pci,id={device.id},memdev={device.id}-ram,"
        f"block-size={device.block_mib}M,requested-size=0"
    )
    return [("-object", backend), ("-device", pci)]


class QemuGuest:
    """One QEMU guest booted from image/build, its agent reachable on a forwarded TCP port;
    use as a context manager."""

    def __init__(
        self,
        config: VMConfig = VMConfig(),
        image_dir: Path | None = None,
        workdir: Path | None = None,
        boot_timeout: float = 240.0,
    ) -> None:
        self.config = config
        self.machine = machine_of(config)
        self.flavour = flavour_of(config)
        self.image_dir = image_dir or image_dir_for(config.arch)
        self.boot_timeout = boot_timeout
        # A caller-given workdir is kept (console log for post-mortems); a temporary one is not.
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="guestvm-"))
        self.host_port = free_tcp_port()
        self.boot_seconds: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._qmp_client: Any = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        """QEMU's process id, for host-side figures (RSS, smaps)."""
        assert self._process is not None, "VM not started"
        return self._process.pid

    @property
    def agent_target(self) -> str:
        return f"tcp://127.0.0.1:{self.host_port}"

    @property
    def console_path(self) -> Path:
        return self.workdir / "console.log"

    @property
    def host_qmp_path(self) -> Path:
        """A QMP socket of its own for a host tool, beside the one qmp() holds."""
        return self.workdir / "qmp-host.sock"

    def disk_path(self, name: str) -> Path:
        return self.workdir / f"disk-{name}.img"

    def start(self, wait: bool = True) -> None:
        """Boot; with wait=False, return once QEMU runs (a test that expects the guest
        never to serve watches console_log() instead)."""
        for disk in self.config.disks:
            with open(self.disk_path(disk.name), "wb") as backing:
                backing.truncate(disk.size_bytes)
        started = time.monotonic()
        # Popen keeps its own copy of the log's descriptor.
        command = self._command_line()
        if self.config.host_cgroup is not None:
            # The shell moves itself into the cgroup, then becomes QEMU: every page QEMU
            # touches is charged there from the first.
            procs = os.path.join(self.config.host_cgroup, "cgroup.procs")
            command = ["sh", "-c", f'echo $$ > {shlex.quote(procs)} && exec "$@"', "qemu", *command]
        with open(self.workdir / "qemu.log", "wb") as qemu_log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=qemu_log,
                stderr=subprocess.STDOUT,
            )
        if not wait:
            return
        try:
            self._wait_ready(started + self.boot_timeout)
        except BaseException:
            self.stop()
            raise
        self.boot_seconds = time.monotonic() - started

    def _command_line(self) -> list[str]:
        config = self.config
        accel, cpu = accelerator(self.image_dir / "vmlinuz", config.arch)
        kernel_args = [
            f"console={self.machine.console} psi=1 init={self.flavour.init} root=/dev/vda rw",
            "quiet panic=-1",
        ]
        harness_args, harness_options = self._harness_options()
        kernel_args += harness_args
        if self.flavour.agent_args_from_cmdline:
            kernel_args.append(f"guestagent.listen={config.listen}")
        if config.agent_args:
            kernel_args.append("guestagent.args=" + ",".join(config.agent_args))
        kernel_args += [disk.cmdline for disk in config.readonly_disks if disk.cmdline]
        if config.extra_cmdline:
            kernel_args.append(config.extra_cmdline)
        memory = f"{config.memory_mib}M"
        if config.slots or config.virtio_mem:
            maxmem = (config.maxmem_mib or 2 * config.memory_mib) if config.slots else 0
            maxmem = max(maxmem, config.memory_mib)
            if config.virtio_mem:
                # The device's region lies in the same hotplug space as the DIMMs.
                maxmem += config.virtio_mem.max_mib
            memory += f",slots={config.slots},maxmem={maxmem}M"
        hostfwd = f"tcp:127.0.0.1:{self.host_port}-:{GUEST_AGENT_PORT}"
        rootfs = self.image_dir / self.flavour.rootfs
        if accel == "tcg" and config.tcg_tb_mib is not None:
            accel = f"tcg,tb-size={config.tcg_tb_mib}"
        options = [
            ("-accel", accel),
            ("-cpu", cpu),
            ("-smp", str(config.cpus)),
            ("-m", memory),
            ("-display", "none"),
            ("-serial", f"file:{self.console_path}"),
            ("-kernel", str(self.image_dir / "vmlinuz")),
            ("-initrd", str(self.image_dir / "initrd.img")),
            ("-append", " ".join(kernel_args)),
            # snapshot=on sends the guest's writes to a throwaway overlay: the image stays pristine.
            (
                "-drive",
                f"file={rootfs},if=none,id=root,format=raw,snapshot=on",
            ),
            ("-device", "virtio-blk-pci,drive=root,serial=guestagent-root"),
            # restrict=on: the guest reaches nothing; only the forwarded agent port is open.
            ("-netdev", f"user,id=n0,restrict=on,hostfwd={hostfwd}"),
            # romfile= drops the PXE option ROM: nothing boots from the network here.
            ("-device", "virtio-net-pci,netdev=n0,romfile="),
            *harness_options,
            ("-qmp", f"unix:{self.workdir / 'qmp.sock'},server=on,wait=off"),
            # A second monitor for a host tool under test (guestctl give-back): a QMP socket
            # serves one client at a time, and qmp() keeps the first.
            ("-qmp", f"unix:{self.host_qmp_path},server=on,wait=off"),
        ]
        for disk in config.disks:
            discard = "unmap" if disk.discard else "ignore"
            backing = f"file={self.disk_path(disk.name)},if=none,format=raw,discard={discard}"
            serial = f",serial={disk.serial}" if disk.serial else ""
            options.append(("-drive", f"{backing},id=disk-{disk.name}"))
            options.append(("-device", f"virtio-blk-pci,drive=disk-{disk.name}{serial}"))
        for index, image in enumerate(config.readonly_disks):
            drive = f"file={image.path},if=none,format=raw,readonly=on,id=ro{index}"
            options.append(("-drive", drive))
            options.append(("-device", f"virtio-blk-pci,drive=ro{index},serial={image.serial}"))
        if config.balloon:
            reporting = "on" if config.free_page_reporting else "off"
            balloon = f"virtio-balloon-pci,id=balloon0,free-page-reporting={reporting}"
            options.append(("-device", balloon))
        if config.virtio_mem:
            if installed_qemu_version(config.arch) < self.machine.virtio_mem_since:
                raise ValueError(f"{self.machine.qemu} is older than virtio-mem on this board")
            options += virtio_mem_options(config.virtio_mem)
        flags = [self.machine.qemu, *self.machine.board, "-nodefaults", "-no-user-config"]
        flags.append("-no-reboot")
        return flags + [word for option in options for word in option]

    def _harness_options(self) -> tuple[list[str], list[tuple[str, str]]]:
        """Kernel arguments and QEMU options a harness adds (vm/qemu.py: its command channel
        into the guest); a plain boot has none."""
        return [], []

    @property
    def running(self) -> bool:
        """QEMU has not exited (a guest that powers itself off ends it)."""
        return self._alive()

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _wait_ready(self, deadline: float) -> None:
        """Ready means a gRPC (HTTP/2) server answers on the agent port."""
        self._wait_for("QEMU's console", self.console_path.exists, deadline, 0.1)
        waiting_for = f"the agent on guest port {GUEST_AGENT_PORT}"
        self._wait_for(waiting_for, self._agent_answers, deadline, 0.5)

    def _wait_for(
        self, waiting_for: str, ready: Callable[[], bool], deadline: float, poll: float
    ) -> None:
        try:
            while not ready():
                self._check_boot(deadline, waiting_for)
                time.sleep(poll)
        except (TimeoutError, GuestVMError) as error:
            raise self._boot_error(f"{waiting_for}: {error}") from error

    def _check_boot(self, deadline: float, waiting_for: str) -> None:
        if not self._alive():
            raise GuestVMError(f"QEMU exited with {self._process and self._process.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not ready after {self.boot_timeout:.0f}s")

    def _boot_error(self, reason: str) -> GuestVMError:
        qemu_log = (self.workdir / "qemu.log").read_text(errors="replace")[-2000:]
        console_tail = "\n".join(self.console_log().splitlines()[-40:])
        return GuestVMError(
            f"guest not ready, waiting for {reason}\n--- qemu ---\n{qemu_log}\n"
            f"--- console tail ({self.console_path}) ---\n{console_tail}"
        )

    def _agent_answers(self) -> bool:
        # The user-mode network accepts every host connection and closes it only once the guest
        # refuses, so a successful connect alone proves nothing: wait for the server's SETTINGS.
        try:
            with socket.create_connection(("127.0.0.1", self.host_port), timeout=2) as conn:
                conn.sendall(HTTP2_PREFACE)
                reply = conn.recv(9)
        except OSError:
            return False
        return len(reply) >= 4 and reply[3] == HTTP2_SETTINGS_FRAME_TYPE

    def qmp(self, command: str, **args: Any) -> Any:
        """Run a QMP command and return its result; hyphenated names: qmp("x", **{"a-b": 1})."""
        if self._qmp_client is None:
            let_ssl_in()  # qemu.qmp imports ssl (host/tls.py).
            from qemu.qmp.legacy import QEMUMonitorProtocol

            self._qmp_client = QEMUMonitorProtocol(str(self.workdir / "qmp.sock"))
            self._qmp_client.connect()
        return self._qmp_client.cmd(command, **args)

    def console_log(self) -> str:
        return self.console_path.read_text(errors="replace") if self.console_path.exists() else ""

    def stop(self, timeout: float = 20.0) -> None:
        """Each of _shutdowns() in turn (QMP quit), else kill."""
        if self._process is not None:
            for shutdown in self._shutdowns():
                if not self._alive():
                    break
                try:
                    shutdown()
                    self._process.wait(timeout)
                except (OSError, subprocess.TimeoutExpired, GuestVMError):
                    continue
            if self._alive():
                self._process.kill()
            self._process.wait()
        if self._qmp_client is not None:
            # After a QMP quit QEMU has closed the monitor, which the client reports as EOF.
            with contextlib.suppress(EOFError):
                self._qmp_client.close()
            self._qmp_client = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _shutdowns(self) -> tuple[Callable[[], None], ...]:
        return (self._quit_qemu,)

    def _quit_qemu(self) -> None:
        let_ssl_in()
        from qemu.qmp import QMPError

        # QEMU may close the monitor before its reply arrives; the caller's wait decides.
        with contextlib.suppress(QMPError):
            self.qmp("quit")
