"""Device-mapper devices as sysfs shows them (/sys/block/dm-*/dm), apart from the ioctls that
make and remove them (dm.py): a starting agent looks for its own mappings with this alone.
"""

from __future__ import annotations

import os

from guestagent.linux.fs import KernelFS
from guestagent.records import record


@record
class Mapping:
    """A device-mapper device as sysfs shows it."""

    name: str  # The mapping's name, e.g. guestagent-swap-vdb.
    sysname: str  # Its kernel name, e.g. dm-0.
    major: int
    minor: int
    slaves: tuple[str, ...]  # Kernel names of the devices under it, e.g. ("vdb",).

    @property
    def devnode(self) -> str:
        """The node devtmpfs always makes; /dev/mapper/NAME is udev's, where its rules are."""
        return f"/dev/{self.sysname}"

    @property
    def mapper_node(self) -> str:
        """The name users know it by (a node where udev has device-mapper's rules)."""
        return f"/dev/mapper/{self.name}"

    @property
    def backing_nodes(self) -> str:
        return ",".join(f"/dev/{slave}" for slave in self.slaves)


def read_mappings(fs: KernelFS) -> list[Mapping]:
    """Every device-mapper device, from /sys/block/dm-*/dm/name, dev and slaves/."""
    block = fs.sys("block")
    if not fs.is_dir(block):
        return []
    found = []
    for sysname in fs.listdir(block):
        directory = os.path.join(block, sysname)
        name = fs.read_optional(os.path.join(directory, "dm", "name"))
        if name is None:
            continue
        major, _, minor = fs.read(os.path.join(directory, "dev")).strip().partition(":")
        slaves = os.path.join(directory, "slaves")
        found.append(
            Mapping(
                name.strip(),
                sysname,
                int(major),
                int(minor),
                tuple(fs.listdir(slaves)) if fs.is_dir(slaves) else (),
            )
        )
    return found


def mapping_named(fs: KernelFS, name: str) -> Mapping | None:
    return next((m for m in read_mappings(fs) if m.name == name), None)
