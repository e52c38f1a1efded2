"""Build the agent as a Kata guest extension image (kata-containers'
docs/design/composable-vm-images.md).

The image is an MBR disk: partition 1 holds an EROFS of the runtime tree (built for the
prefix the guest mounts it at), partition 2 the dm-verity hash tree of partition 1, with no
verity superblock: the guest takes the root hash from the kernel command line. The same
inputs give the same bytes: fixed timestamps, owners and filesystem UUID, a salt derived
from the EROFS bytes and a disk identifier derived from the root hash.

Usage: python -m guestagent.build.extension --debs TREE --site DIR --wheel WHL --out IMG
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from guestagent.build import runtime
from guestagent.sizes import MIB

NAME = "guestagent"
MOUNT_ROOT = PurePosixPath("/run/kata-extensions")
PREFIX = MOUNT_ROOT / NAME
# virtio-blk serials are at most 20 bytes: "extension-" leaves 10 for the name.
SERIAL_PREFIX = "extension-"
SERIAL_MAX = 20
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]+")
BLOCK = 4096
SECTOR = 512
# Partition 1 starts at 1 MiB, as kata's image builder places it, and both partitions are
# whole MiBs: sfdisk aligns partitions to its 1 MiB grain.
FIRST_PARTITION_OFFSET = MIB
AGENT_SOCKET = "/run/guestagent.sock"
VSOCK_PORT = 6464
# glibc loads none of the guest's locale files in the C locale (docs/runtime.md).
LOCALE = "C"
COMPONENTS = PurePosixPath("etc/kata-extensions/components.toml")
OPERATOR_UNIT = PurePosixPath("etc/systemd/system/guestagent-extension.service")
# The bundle's unit, which the extension's is made from.
BUNDLE_UNIT = Path(__file__).resolve().parents[2] / "image" / "guestagent.service"


class ExtensionError(RuntimeError):
    """The image cannot be built as asked; the message names what and why."""


def check_name(name: str) -> str:
    """A name the guest's generator accepts and whose serial fits virtio-blk's 20 bytes."""
    if not NAME_PATTERN.fullmatch(name):
        raise ExtensionError(f"extension name {name!r} is not [A-Za-z0-9_-]+")
    if len(SERIAL_PREFIX + name) > SERIAL_MAX:
        raise ExtensionError(
            f"extension name {name!r}: serial {SERIAL_PREFIX + name!r} is over {SERIAL_MAX} bytes"
        )
    return name


@dataclass(frozen=True)
class VerityParams:
    """What the runtime puts on the kernel command line as kata.extension.NAME.verity_params."""

    root_hash: str
    salt: str
    data_blocks: int
    data_block_size: int = BLOCK
    hash_block_size: int = BLOCK

    def __str__(self) -> str:
        return (
            f"root_hash={self.root_hash},salt={self.salt},data_blocks={self.data_blocks},"
            f"data_block_size={self.data_block_size},hash_block_size={self.hash_block_size}"
        )

    @classmethod
    def parse(cls, text: str) -> VerityParams:
        fields = dict(item.partition("=")[::2] for item in text.strip().split(","))
        try:
            return cls(
                fields["root_hash"],
                fields["salt"],
                int(fields["data_blocks"]),
                int(fields["data_block_size"]),
                int(fields["hash_block_size"]),
            )
        except (KeyError, ValueError) as e:
            raise ExtensionError(f"verity params {text!r}: {e}") from None


def root_hash_of(veritysetup_output: str) -> str:
    """The root hash from `veritysetup format`'s report."""
    match = re.search(r"^Root hash:\s*([0-9a-f]+)\s*$", veritysetup_output, re.MULTILINE)
    if match is None:
        raise ExtensionError(f"no root hash in veritysetup's output: {veritysetup_output!r}")
    return match.group(1)


@dataclass(frozen=True)
class Process:
    """One [[process]] of components.toml, as kata-agent reads it."""

    id: str
    path: str
    level: int = 1
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    wait_socket: str = ""
    timeout_secs: int = 0

    def __post_init__(self) -> None:
        parts = PurePosixPath(self.path).parts
        if self.path.startswith("/") or ".." in parts or not parts:
            raise ExtensionError(f"process {self.id}: path {self.path!r} must stay in the root")


def toml_string(text: str) -> str:
    # A JSON string of printable ASCII is a TOML basic string; anything else is refused so
    # the guest's small reader never sees an escape it cannot undo.
    if not all(" " <= c <= "~" for c in text) or "\\" in text:
        raise ExtensionError(f"{text!r}: only printable ASCII without backslashes")
    return json.dumps(text)


def components_toml(processes: Sequence[Process]) -> str:
    """components.toml, one value per line and arrays on one line: the shape the test
    guest's stand-in (image/kata/kata-agent-standin) reads, and valid TOML for kata-agent."""
    lines = [
        "# What kata-agent starts from this extension (components.toml, schema 1).",
        "schema_version = 1",
    ]
    for process in processes:
        lines += [
            "",
            "[[process]]",
            f"id = {toml_string(process.id)}",
            f"level = {process.level}",
            f"path = {toml_string(process.path)}",
            f"args = [{', '.join(map(toml_string, process.args))}]",
        ]
        if process.wait_socket:
            lines.append(f"wait_socket = {toml_string(process.wait_socket)}")
            # kata-agent reads timeout_secs as a string holding an integer.
            lines.append(f"timeout_secs = {toml_string(str(process.timeout_secs))}")
        if process.env:
            lines += ["", "[process.env]"]
            lines += [f"{key} = {toml_string(value)}" for key, value in process.env.items()]
    return "\n".join(lines) + "\n"


def agent_args(extra: Sequence[str] = ()) -> tuple[str, ...]:
    return (
        "serve",
        "--listen",
        f"vsock://:{VSOCK_PORT}",
        "--listen",
        f"unix://{AGENT_SOCKET}",
        *extra,
    )


def agent_process(extra_args: Sequence[str] = ()) -> Process:
    return Process(
        id="guestagent",
        path="bin/guestagent",
        level=1,
        args=agent_args(extra_args),
        env={"LC_ALL": LOCALE},
        wait_socket=AGENT_SOCKET,
        timeout_secs=30,
    )


def operator_unit(bundle_unit: str, extra_args: Sequence[str] = ()) -> str:
    """The unit an operator copies into a systemd base image while kata-agent launches
    processes only from the extension named coco (docs/kata-extension.md): the bundle's unit
    (image/guestagent.service), its hardening and memory bounds included, started from the
    extension's mount."""
    mount = f"kata-extension-mount@{NAME}.service"
    replaced = {
        "Description": "guestagent memory agent, from its Kata guest extension",
        "ExecStart": f"{PREFIX}/bin/guestagent {' '.join(agent_args(extra_args))}",
    }
    lines = [
        "# Starts guestagent from its Kata guest extension. Copy into the base image's",
        "# /etc/systemd/system and enable it (docs/kata-extension.md says why). Made by",
        "# guestagent/build/extension.py from the bundle's image/guestagent.service.",
    ]
    body = bundle_unit[bundle_unit.index("[Unit]") :]  # Not the bundle's own header.
    for line in body.splitlines():
        key = line.partition("=")[0]
        if key == "EnvironmentFile":  # The arguments are in ExecStart, as in components.toml.
            continue
        lines.append(f"{key}={replaced[key]}" if key in replaced else line)
        if key == "Description":
            lines += [f"Requires={mount}", f"After={mount}"]
        elif key == "ProtectSystem":
            lines += [
                f"# Its socket is {AGENT_SOCKET}, components.toml's (docs/kata-extension.md",
                "# says why not in its RuntimeDirectory), linked into place from a private",
                "# directory beside it: /run stays writable.",
                "ReadWritePaths=/run",
            ]
    return "\n".join(lines) + "\n"


def runtime_snippet(path: Path, params: VerityParams, name: str = NAME) -> str:
    """The runtime's configuration entry (runtime-rs, QEMU) for this image."""
    return (
        "[[hypervisor.qemu.guest_extension_images]]\n"
        f'name = "{name}"\n'
        f'path = "{path}"\n'
        f'verity_params = "{params}"\n'
    )


@dataclass(frozen=True)
class DiskLayout:
    """Byte offsets and sizes of the two partitions; both are whole 4 KiB blocks."""

    data_offset: int
    data_bytes: int
    hash_offset: int
    hash_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.hash_offset + self.hash_bytes

    def sfdisk_script(self, label_id: int) -> str:
        return (
            "label: dos\n"
            f"label-id: {label_id:#010x}\n"
            "unit: sectors\n"
            f"start={self.data_offset // SECTOR}, size={self.data_bytes // SECTOR}, "
            "type=83, bootable\n"
            f"start={self.hash_offset // SECTOR}, size={self.hash_bytes // SECTOR}, type=83\n"
        )


def whole_mib(size: int) -> int:
    return -(-size // MIB) * MIB


def disk_layout(data_bytes: int, hash_bytes: int) -> DiskLayout:
    """Partition 1 exactly as large as the (padded) data dm-verity covers, partition 2 the
    hash tree rounded up to a MiB."""
    if data_bytes % MIB or not data_bytes or not hash_bytes:
        raise ExtensionError(f"data of {data_bytes} bytes: not whole MiBs, or no hash tree")
    hash_offset = FIRST_PARTITION_OFFSET + data_bytes
    return DiskLayout(FIRST_PARTITION_OFFSET, data_bytes, hash_offset, whole_mib(hash_bytes))


def run(command: Sequence[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ExtensionError(f"{' '.join(command)} exited {result.returncode}: {result.stderr}")
    return result.stdout


def make_erofs(tree: Path, image: Path, version: str) -> None:
    """EROFS as kata's builder makes it (lz4hc, no inline data), with every time, owner and
    the UUID fixed so the bytes depend on the tree alone."""
    fs_uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"guestagent-extension-{version}")
    run(
        [
            "mkfs.erofs",
            "--quiet",
            "-zlz4hc",
            "-Enoinline_data",
            "-x-1",
            "-T0",
            f"-U{fs_uuid}",
            "--all-root",
            str(image),
            str(tree),
        ]
    )


def make_verity(data: Path, hashes: Path) -> VerityParams:
    """The hash tree of data, padded first with zeros to whole MiBs: dm-verity covers the
    whole of partition 1, padding included."""
    with data.open("r+b") as f:
        f.truncate(whole_mib(data.stat().st_size))
    size = data.stat().st_size
    # The salt comes from the data, so a rebuild of the same tree gives the same root hash.
    with data.open("rb") as f:
        salt = hashlib.file_digest(f, "sha256").hexdigest()
    hashes.unlink(missing_ok=True)
    hashes.touch()
    out = run(
        [
            "veritysetup",
            "format",
            "--no-superblock",
            f"--data-block-size={BLOCK}",
            f"--hash-block-size={BLOCK}",
            f"--salt={salt}",
            str(data),
            str(hashes),
        ]
    )
    return VerityParams(root_hash_of(out), salt, size // BLOCK)


def assemble_disk(data: Path, hashes: Path, params: VerityParams, out: Path) -> DiskLayout:
    layout = disk_layout(data.stat().st_size, hashes.stat().st_size)
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    with partial.open("wb") as disk:
        disk.truncate(layout.total_bytes)
    subprocess.run(
        ["sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", str(partial)],
        input=layout.sfdisk_script(int(params.root_hash[:8], 16)),
        text=True,
        check=True,
    )
    with partial.open("r+b") as disk:
        for offset, source in ((layout.data_offset, data), (layout.hash_offset, hashes)):
            disk.seek(offset)
            with source.open("rb") as f:
                shutil.copyfileobj(f, disk)
    partial.rename(out)
    return layout


def add_extension_files(tree: Path, extra_args: Sequence[str]) -> None:
    for relative, text in (
        (COMPONENTS, components_toml([agent_process(extra_args)])),
        (OPERATOR_UNIT, operator_unit(BUNDLE_UNIT.read_text(), extra_args)),
    ):
        path = tree / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def build(
    debs: Path,
    site: Path,
    wheel: Path,
    out: Path,
    version: str,
    extra_args: Sequence[str] = (),
    machine: str = "x86_64",
) -> tuple[VerityParams, DiskLayout]:
    target = runtime.TARGETS[machine]
    with tempfile.TemporaryDirectory(prefix="extension-") as scratch_name:
        scratch = Path(scratch_name)
        tree = scratch / "tree"
        runtime.assemble(debs, site, wheel, PREFIX, tree, target)
        lines, problems = runtime.check(tree, PREFIX, machine)
        if problems:
            raise ExtensionError("ELF check: " + "; ".join(problems))
        print(f"extension: ELF check passed, {len(lines)} files resolve inside {PREFIX}")
        add_extension_files(tree, extra_args)
        make_erofs(tree, scratch / "data.erofs", version)
        params = make_verity(scratch / "data.erofs", scratch / "hash.verity")
        layout = assemble_disk(scratch / "data.erofs", scratch / "hash.verity", params, out)
    out.with_suffix(".verity-params").write_text(f"{params}\n")
    return params, layout


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m guestagent.build.extension")
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="build the image and its .verity-params")
    build_cmd.add_argument("--debs", type=Path, required=True, help="the unpacked packages")
    build_cmd.add_argument("--site", type=Path, required=True, help="the pinned wheels, installed")
    build_cmd.add_argument("--wheel", type=Path, required=True, help="the guestagent wheel")
    build_cmd.add_argument("--out", type=Path, required=True, help="the disk image to write")
    build_cmd.add_argument("--version", required=True)
    build_cmd.add_argument(
        "--agent-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for `guestagent serve` in components.toml; repeatable",
    )
    build_cmd.add_argument("--machine", default="x86_64", choices=sorted(runtime.TARGETS))
    snippet_cmd = commands.add_parser(
        "snippet", help="print the runtime's configuration entry for a built image"
    )
    snippet_cmd.add_argument("image", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "snippet":
            params = VerityParams.parse(args.image.with_suffix(".verity-params").read_text())
            print(runtime_snippet(args.image.resolve(), params), end="")
            return 0
        params, layout = build(
            args.debs, args.site, args.wheel, args.out, args.version, args.agent_arg, args.machine
        )
    except (ExtensionError, runtime.BuildError, OSError) as e:
        print(f"extension: {e}", file=sys.stderr)
        return 1
    print(
        f"extension: {args.out}: EROFS {layout.data_bytes} bytes at {layout.data_offset}, "
        f"hash tree {layout.hash_bytes} bytes at {layout.hash_offset}"
    )
    print(f"extension: kata.extension.{NAME}.verity_params={params}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
