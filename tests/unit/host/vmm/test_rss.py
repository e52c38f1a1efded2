"""The host's reading of a VMM's memory: QEMU's smaps, its TCG code buffer, its RSS."""

from __future__ import annotations

from pathlib import Path

from guestagent.host.vmm.rss import Mapping, jit_code_rss_bytes, parse_smaps, read_vmm_memory
from guestagent.linux.fs import KernelFS
from guestagent.sizes import MIB
from tests.fakes.smaps import SMAPS

# A QEMU's /proc/PID/smaps under TCG: its binary, 306 MiB of guest RAM, the 1 GiB
# translated-code buffer (rwxp) and a heap.


def test_parse_smaps() -> None:
    mappings = parse_smaps(SMAPS)
    assert [m.size for m in mappings] == [0x407000, 306 * MIB, 1024 * MIB, 306 * MIB]
    assert mappings[0].path == "/usr/bin/qemu-system-x86_64"
    assert mappings[1] == Mapping(306 * MIB, "rw-p", "", 170000 * 1024)
    assert mappings[3].path == "[heap]"


def test_jit_code_is_the_anonymous_writable_executable_mappings() -> None:
    assert jit_code_rss_bytes(parse_smaps(SMAPS)) == 288000 * 1024
    assert jit_code_rss_bytes(parse_smaps(SMAPS.replace("rwxp", "rw-p"))) == 0
    assert jit_code_rss_bytes(parse_smaps("")) == 0


def test_read_vmm_memory_is_vmrss_less_the_tcg_code(tmp_path: Path) -> None:
    proc = tmp_path / "proc" / "42"
    proc.mkdir(parents=True)
    (proc / "status").write_text("Name:\tqemu\nVmRSS:\t  500000 kB\n")
    (proc / "smaps").write_text(SMAPS)
    memory = read_vmm_memory(42, KernelFS(tmp_path))
    assert memory.rss == 500000 * 1024 and memory.tcg_code == 288000 * 1024
    assert memory.without_tcg_code == 212000 * 1024
