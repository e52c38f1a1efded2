"""A VMM process's memory as the host sees it (/proc/PID/status and smaps): its RSS and, of
that, TCG's translated code, which is no guest memory. One reading for give-back, the
overhead measurement and the VM harness."""

from __future__ import annotations

from dataclasses import dataclass

from guestagent.linux.fs import KernelFS
from guestagent.linux.mm import rss_bytes


@dataclass(frozen=True)
class Mapping:
    size: int
    perms: str
    path: str  # "" for anonymous memory
    rss: int


def parse_smaps(text: str) -> list[Mapping]:
    """/proc/PID/smaps: a header line per mapping ("start-end perms offset dev inode path"),
    then "Key: N kB" lines."""
    mappings: list[Mapping] = []
    header: list[str] | None = None
    rss = 0

    def close() -> None:
        if header is not None:
            start, end = (int(part, 16) for part in header[0].split("-"))
            path = header[5] if len(header) > 5 else ""
            mappings.append(Mapping(end - start, header[1], path, rss))

    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if not fields[0].endswith(":") and "-" in fields[0]:
            close()
            header, rss = fields, 0
        elif fields[0] == "Rss:":
            rss = int(fields[1]) * 1024
    close()
    return mappings


def jit_code_rss_bytes(mappings: list[Mapping]) -> int:
    """Resident bytes of the anonymous writable-and-executable mappings: in QEMU under TCG,
    the buffer of translated guest code (up to 1 GiB, filled as the guest runs new code and
    kept resident), which is no guest memory."""
    return sum(m.rss for m in mappings if m.path == "" and m.perms == "rwxp")


@dataclass(frozen=True)
class VmmMemory:
    rss: int  # VmRSS
    mappings: list[Mapping]

    @property
    def tcg_code(self) -> int:
        return jit_code_rss_bytes(self.mappings)

    @property
    def without_tcg_code(self) -> int:
        """The RSS less TCG's translated code (0 under KVM and for the other VMMs), which
        grows as the guest runs new code whatever the guest holds: the guest's memory and
        the VMM's own, what a give-back is measured by."""
        return self.rss - self.tcg_code


def read_rss(pid: int, fs: KernelFS | None = None) -> int:
    """The process's VmRSS, without reading its smaps."""
    fs = fs or KernelFS()
    return rss_bytes(fs.read(fs.proc(str(pid), "status")))


def read_vmm_memory(pid: int, fs: KernelFS | None = None) -> VmmMemory:
    fs = fs or KernelFS()
    return VmmMemory(read_rss(pid, fs), parse_smaps(fs.read(fs.proc(str(pid), "smaps"))))
