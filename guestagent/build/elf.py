"""Just enough of ELF to say where a file's loader and libraries would come from.

The runtime tree must load nothing from the guest's userland: every executable names the
tree's own loader, and every NEEDED library is found inside the tree by the search the
loader really does (glibc's ld.so: the object's DT_RUNPATH if it has one, otherwise the
DT_RPATH of the objects that loaded it up to the executable).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 14, 15, 29
MACHINES = {62: "x86_64", 183: "aarch64"}


class ElfError(ValueError):
    """A file that starts like ELF but cannot be read as the 64-bit little-endian ELF we ship."""


@dataclass(frozen=True)
class ElfInfo:
    machine: str
    interpreter: str | None
    needed: tuple[str, ...]
    soname: str | None
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]

    @property
    def is_executable(self) -> bool:
        """Started by execve: it has a loader and is not a library (libc.so.6 has both a
        PT_INTERP and a SONAME; loaded as a library, its PT_INTERP is never used)."""
        return self.interpreter is not None and self.soname is None


def is_elf(head: bytes) -> bool:
    return head[:4] == MAGIC


def parse_elf(data: bytes) -> ElfInfo:
    """The loader, machine and dynamic entries of a 64-bit little-endian ELF file."""
    if not is_elf(data) or len(data) < 64:
        raise ElfError("not an ELF file")
    if data[4] != ELFCLASS64 or data[5] != ELFDATA2LSB:
        raise ElfError(f"ELF class {data[4]}, data {data[5]}: only 64-bit little-endian is read")
    e_machine = struct.unpack_from("<H", data, 18)[0]
    e_phoff = struct.unpack_from("<Q", data, 32)[0]
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 54)
    segments = [
        struct.unpack_from("<IIQQQQQQ", data, e_phoff + i * e_phentsize) for i in range(e_phnum)
    ]
    interpreter = None
    dynamic: list[tuple[int, int]] = []
    for p_type, _flags, p_offset, _vaddr, _paddr, p_filesz, _memsz, _align in segments:
        if p_type == PT_INTERP:
            interpreter = data[p_offset : p_offset + p_filesz].split(b"\0")[0].decode()
        elif p_type == PT_DYNAMIC:
            for offset in range(p_offset, p_offset + p_filesz, 16):
                tag, value = struct.unpack_from("<qQ", data, offset)
                if tag == DT_NULL:
                    break
                dynamic.append((tag, value))
    loads = [
        (vaddr, offset, filesz)
        for t, _f, offset, vaddr, _p, filesz, _m, _a in segments
        if t == PT_LOAD
    ]

    def file_offset(address: int) -> int:
        for vaddr, offset, filesz in loads:
            if vaddr <= address < vaddr + filesz:
                return int(offset + address - vaddr)
        raise ElfError(f"address {address:#x} is in no loaded segment")

    strtab = next((file_offset(v) for t, v in dynamic if t == DT_STRTAB), None)

    def string(index: int) -> str:
        if strtab is None:
            raise ElfError("dynamic entries without a string table")
        end = data.index(b"\0", strtab + index)
        return data[strtab + index : end].decode()

    def strings(tag: int) -> list[str]:
        return [string(v) for t, v in dynamic if t == tag]

    def search_path(tag: int) -> tuple[str, ...]:
        return tuple(d for value in strings(tag) for d in value.split(":") if d)

    sonames = strings(DT_SONAME)
    return ElfInfo(
        machine=MACHINES.get(e_machine, f"machine-{e_machine}"),
        interpreter=interpreter,
        needed=tuple(strings(DT_NEEDED)),
        soname=sonames[0] if sonames else None,
        rpath=search_path(DT_RPATH),
        runpath=search_path(DT_RUNPATH),
    )


@dataclass(frozen=True)
class Resolved:
    """One file of the tree, where its loader and each library it needs come from."""

    path: PurePosixPath  # As installed in the guest: under the prefix.
    info: ElfInfo
    interpreter: PurePosixPath | None
    libraries: tuple[tuple[str, PurePosixPath | None], ...]  # (NEEDED, found at or None)


def expand_origin(entry: str, installed: PurePosixPath) -> PurePosixPath:
    return PurePosixPath(
        os.path.normpath(
            entry.replace("$ORIGIN", str(installed.parent)).replace(
                "${ORIGIN}", str(installed.parent)
            )
        )
    )


def inside(path: PurePosixPath, prefix: PurePosixPath) -> bool:
    return path == prefix or prefix in path.parents


def resolve(files: dict[PurePosixPath, ElfInfo], prefix: PurePosixPath) -> list[Resolved]:
    """Where each file's loader and libraries come from, as installed under prefix.

    files maps installed paths to their ELF facts; a library is found when a file of that
    name exists in files (so, in the tree) in a directory of the search path. A search
    directory outside the prefix never counts: that is the guest's userland.
    """
    executables_rpath = tuple(
        PurePosixPath(d)
        for path, info in sorted(files.items())
        if info.is_executable
        for d in info.rpath
    )
    resolved = []
    for path, info in sorted(files.items()):
        if info.runpath:
            directories = tuple(expand_origin(d, path) for d in info.runpath)
        else:
            own = tuple(expand_origin(d, path) for d in info.rpath)
            # A library may be loaded by any of the executables: their RPATH applies to it.
            directories = own if info.is_executable else own + executables_rpath
        directories = tuple(d for d in dict.fromkeys(directories) if inside(d, prefix))
        libraries = []
        for name in info.needed:
            found = next((d / name for d in directories if d / name in files), None)
            libraries.append((name, found))
        interpreter = None
        if info.is_executable and info.interpreter is not None:
            candidate = PurePosixPath(info.interpreter)
            interpreter = candidate if candidate in files else None
        resolved.append(Resolved(path, info, interpreter, tuple(libraries)))
    return resolved


def problems(resolved: Iterable[Resolved], machine: str) -> list[str]:
    """Every way the tree would reach outside itself, or hold a file for another machine."""
    found = []
    for item in resolved:
        if item.info.machine != machine:
            found.append(f"{item.path}: built for {item.info.machine}, not {machine}")
        if item.info.is_executable and item.interpreter is None:
            found.append(f"{item.path}: loader {item.info.interpreter} is not in the tree")
        found.extend(
            f"{item.path}: needs {name}, found nowhere in the tree"
            for name, at in item.libraries
            if at is None
        )
    return found


def report(resolved: Iterable[Resolved]) -> Iterator[str]:
    """One line per file: its kind, loader and where each library it needs comes from."""
    for item in resolved:
        kind = "exec" if item.info.is_executable else "lib "
        loader = f" loader={item.interpreter}" if item.info.is_executable else ""
        needs = ", ".join(f"{name}={at or 'MISSING'}" for name, at in item.libraries)
        yield f"{kind} {item.path}{loader}" + (f" needs {needs}" if needs else "")


def scan_tree(root: Path, prefix: PurePosixPath) -> dict[PurePosixPath, ElfInfo]:
    """Every ELF file below root, keyed by where it will be installed. Symbolic links are
    left out: the file a link names is checked under its own name."""
    files: dict[PurePosixPath, ElfInfo] = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        with path.open("rb") as f:
            if not is_elf(f.read(4)):
                continue
        files[prefix / path.relative_to(root).as_posix()] = parse_elf(path.read_bytes())
    return files
