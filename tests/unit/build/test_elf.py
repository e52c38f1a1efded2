"""The ELF reader against readelf on real files, and the resolution rules as a table."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from guestagent.build.elf import ElfError, ElfInfo, parse_elf, problems, resolve

REAL_FILES = [Path(sys.executable).resolve(), Path("/bin/true").resolve()]
REAL_FILES += [p for p in Path("/lib/x86_64-linux-gnu").glob("libc.so.6") if p.exists()]


def readelf_facts(path: Path) -> tuple[str | None, list[str], list[str]]:
    program = subprocess.run(["readelf", "-lW", str(path)], capture_output=True, text=True).stdout
    interp = re.search(r"\[Requesting program interpreter: (.*)\]", program)
    dynamic = subprocess.run(["readelf", "-dW", str(path)], capture_output=True, text=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", dynamic)
    soname = re.findall(r"\(SONAME\)\s+Library soname: \[(.*)\]", dynamic)
    return (interp.group(1) if interp else None), needed, soname


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) not installed")
@pytest.mark.parametrize("path", REAL_FILES, ids=str)
def test_parse_agrees_with_readelf(path: Path) -> None:
    info = parse_elf(path.read_bytes())
    interp, needed, soname = readelf_facts(path)
    assert (info.interpreter, list(info.needed), [info.soname] if info.soname else []) == (
        interp,
        needed,
        soname,
    )
    assert info.machine in ("x86_64", "aarch64")


def test_non_elf_and_32_bit_are_refused() -> None:
    with pytest.raises(ElfError, match="not an ELF"):
        parse_elf(b"#!/bin/sh\n" + bytes(100))
    with pytest.raises(ElfError, match="only 64-bit little-endian"):
        parse_elf(b"\x7fELF\x01\x01" + bytes(100))


PREFIX = PurePosixPath("/opt/ga")
LOADER = "/opt/ga/lib/ld-linux-x86-64.so.2"


def exe(*needed: str, interp: str = LOADER, rpath: tuple[str, ...] = ("/opt/ga/lib",)) -> ElfInfo:
    return ElfInfo("x86_64", interp, needed, None, rpath, ())


def lib(
    soname: str, *needed: str, runpath: tuple[str, ...] = (), machine: str = "x86_64"
) -> ElfInfo:
    return ElfInfo(machine, None, needed, soname, (), runpath)


BASE = {
    PurePosixPath(LOADER): lib("ld-linux-x86-64.so.2"),
    PurePosixPath("/opt/ga/lib/libc.so.6"): lib("libc.so.6", "ld-linux-x86-64.so.2"),
    PurePosixPath("/opt/ga/lib/libz.so.1"): lib("libz.so.1", "libc.so.6"),
    PurePosixPath("/opt/ga/bin/python"): exe("libc.so.6"),
}

CASES = {
    "all inside": ({"/opt/ga/bin/python": exe("libc.so.6", "libz.so.1")}, []),
    "loader of the guest": (
        {"/opt/ga/bin/python": exe("libc.so.6", interp="/lib64/ld-linux-x86-64.so.2")},
        ["/opt/ga/bin/python: loader /lib64/ld-linux-x86-64.so.2 is not in the tree"],
    ),
    "library nowhere": (
        {"/opt/ga/bin/python": exe("libffi.so.8")},
        ["/opt/ga/bin/python: needs libffi.so.8, found nowhere in the tree"],
    ),
    "rpath outside the tree never counts": (
        {"/opt/ga/bin/tool": exe("libc.so.6", rpath=("/usr/lib",))},
        ["/opt/ga/bin/tool: needs libc.so.6, found nowhere in the tree"],
    ),
    "an extension module finds libraries through the executable's rpath": (
        {
            "/opt/ga/bin/python": exe("libc.so.6"),
            "/opt/ga/lib/py/_ctypes.so": lib("", "libz.so.1"),
        },
        [],
    ),
    "runpath replaces the executable's rpath": (
        {
            "/opt/ga/bin/python": exe("libc.so.6"),
            "/opt/ga/lib/py/_x.so": lib("", "libz.so.1", runpath=("$ORIGIN/../elsewhere",)),
        },
        ["/opt/ga/lib/py/_x.so: needs libz.so.1, found nowhere in the tree"],
    ),
    "runpath with $ORIGIN inside the tree": (
        {
            "/opt/ga/bin/python": exe("libc.so.6"),
            "/opt/ga/lib/py/_x.so": lib("", "libz.so.1", runpath=("$ORIGIN/..",)),
            "/opt/ga/lib/libz.so.1": lib("libz.so.1"),
        },
        [],
    ),
    "another machine": (
        {"/opt/ga/lib/libarm.so": lib("libarm.so", machine="aarch64")},
        ["/opt/ga/lib/libarm.so: built for aarch64, not x86_64"],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_resolution(name: str) -> None:
    extra, expected = CASES[name]
    files = {**BASE, **{PurePosixPath(k): v for k, v in extra.items()}}
    assert problems(resolve(files, PREFIX), "x86_64") == expected


def test_a_library_with_a_loader_is_not_an_executable() -> None:
    """libc.so.6 has a PT_INTERP and a SONAME: loaded as a library, its PT_INTERP is unused."""
    libc = ElfInfo("x86_64", "/lib64/ld-linux-x86-64.so.2", (), "libc.so.6", (), ())
    assert not libc.is_executable
    files = {**BASE, PurePosixPath("/opt/ga/lib/libc.so.6"): libc}
    assert problems(resolve(files, PREFIX), "x86_64") == []
