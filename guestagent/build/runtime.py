"""Assemble a self-contained runtime tree for one program and one install prefix: the
guest's agent (`make bundle`, `make extension`) or the host's node daemon (`make node-bundle`).

Everything the program executes comes from its tree: Debian 12's CPython 3.11 with the stdlib
modules the program can import, the pinned wheels, its side of the package, the shared
libraries all of them load, glibc and its loader, and the tools it runs. The interpreter and
the tools are rewritten (patchelf) to name the tree's loader and to search the tree's lib/
first, so they run on a machine with any libc or none, with no shell on the start path. Paths
are absolute, so the tree works only at the prefix it was built for. What differs between the
two trees is a TreeSpec; the build is the same.

Usage: python -m guestagent.build.runtime [--tree guest|node] --debs TREE --site DIR --wheel WHL
       --prefix P --out DIR
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from guestagent.build import elf
from guestagent.build.modules import Module, closure

PYTHON_VERSION = "3.11"
# Imported by the interpreter itself, not by an import statement the closure can read.
STARTUP_MODULES = ("site", "_sitebuiltins", "encodings", "codecs", "io", "abc", "stat", "os")
# Codecs are looked up by name, never imported by a statement. The agent runs in UTF-8 mode
# (-X utf8), whatever the guest's locale, so these are all it can use: the interpreter's own,
# and idna for host names in socket addresses.
CODECS = tuple(
    f"encodings.{name}"
    for name in (
        "aliases",
        "utf_8",
        "utf_8_sig",
        "ascii",
        "latin_1",
        "idna",
        "raw_unicode_escape",
        "unicode_escape",
    )
)
# Reached only through interactive help() (pydoc), self-tests, or process pools that neither
# program starts (both run blocking work on threads): left out of the closure.
NEVER_IMPORTED = frozenset({"pydoc", "doctest", "unittest", "test", "concurrent.futures.process"})
# glibc loads libgcc_s with dlopen for pthread_exit (a CPython thread at shutdown), so no
# NEEDED entry names it.
LIBGCC = "libgcc_s.so.1"


@dataclass(frozen=True)
class Target:
    """A machine the tree is built for: Debian's multiarch triplet and its loader."""

    machine: str
    triplet: str
    loader: str

    @property
    def emulator(self) -> str:
        """qemu-user for this machine (Debian's qemu-user-static), for a foreign build."""
        return f"qemu-{self.machine}-static"

    @property
    def extension_suffixes(self) -> tuple[str, ...]:
        return (f".cpython-311-{self.triplet}.so", ".abi3.so", ".so")


TARGETS = {
    "x86_64": Target("x86_64", "x86_64-linux-gnu", "ld-linux-x86-64.so.2"),
    "aarch64": Target("aarch64", "aarch64-linux-gnu", "ld-linux-aarch64.so.1"),
}


@dataclass(frozen=True)
class Layout:
    """Where things go in the tree, relative to its root."""

    bin: Path = Path("bin")
    sbin: Path = Path("sbin")
    lib: Path = Path("lib")
    stdlib: Path = Path("lib/python3.11")
    dynload: Path = Path("lib/python3.11/lib-dynload")
    # Debian's site.py adds PREFIX/lib/python3/dist-packages to sys.path.
    site: Path = Path("lib/python3/dist-packages")
    share: Path = Path("share/guestagent")


LAYOUT = Layout()


# What the agent's start and a served call load, C extensions' own imports included (cygrpc
# imports pkgutil from C, for instance, where no import statement shows it).
GUEST_TRACE = """
import asyncio, os, sys, tempfile
sys.path[:0] = sys.argv[1:]
sys.modules["ssl"] = None
import guestagent.agent.daemon, grpc, grpc.aio, pyudev
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

async def serve_once(path):
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port("unix://" + path)
    await server.start()
    async with grpc.aio.insecure_channel("unix://" + path) as channel:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    await server.stop(None)

with tempfile.TemporaryDirectory() as d:
    asyncio.run(serve_once(os.path.join(d, "s")))
print(*sorted(sys.modules))
"""

# What the node daemon's start, a call to an agent over grpc's blocking API (its client's, and
# the CRI's) and a scrape load.
NODE_TRACE = """
import os, sys, tempfile
from concurrent import futures
sys.path[:0] = sys.argv[1:]
import grpc, guestagent.host.ctl, guestagent.host.node.daemon, guestagent.host.vmm.connect
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from guestagent.host.metrics.exposition import exposition
from guestagent.host.node.metrics import node_families

with tempfile.TemporaryDirectory() as d:
    target = "unix://" + os.path.join(d, "s")
    server = grpc.server(futures.ThreadPoolExecutor(1))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_insecure_port(target)
    server.start()
    with grpc.insecure_channel(target) as channel:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    server.stop(None)
exposition(node_families([], {}, None, None))
print(*sorted(sys.modules))
"""


@dataclass(frozen=True)
class TreeSpec:
    """What one tree carries and how its program starts; the build is the same for each."""

    name: str
    roots: tuple[str, ...]  # The program's modules: what they import, directly or not, ships.
    forbidden: tuple[str, ...]  # Never in the tree: the build fails if the closure reaches one.
    tools: tuple[str, ...]  # Programs from the packages' /sbin, patched like the interpreter.
    dlopened: tuple[str, ...]  # Libraries loaded with dlopen, which no NEEDED entry names.
    trace: str  # Run at build time: what it loads from C counts as imported (GUEST_TRACE).
    command: str  # bin/COMMAND, the entry script.
    entry: tuple[str, str]  # The module and the function the script calls.
    sanity: str  # What the trimmed tree must still import.


GUEST = TreeSpec(
    name="guest side",
    # The agent's command line: what it imports, directly or not, is the guest side.
    roots=("guestagent.__main__", "guestagent.agent.entry"),
    # Never in a guest: the host's tools, the VM harness and this build.
    forbidden=("guestagent.host", "guestagent.vm", "guestagent.build"),
    # The programs the agent runs (guestagent/linux/tools.py finds them here first).
    tools=("mkswap", "blkid"),
    # libudev: pyudev opens it through ctypes.
    dlopened=(LIBGCC, "libudev.so.1"),
    trace=GUEST_TRACE,
    command="guestagent",
    entry=("guestagent.agent.entry", "entry"),
    sanity="guestagent.agent.daemon, pyudev",
)

NODE = TreeSpec(
    name="node daemon",
    # guestctl, whose `node` command is the daemon: every command's static imports, and the
    # lazy ones (function-level imports count) of the daemon and its VMM backends (qemu.qmp
    # for a declared QEMU).
    roots=(
        "guestagent.host.entry",
        "guestagent.host.ctl",
        "guestagent.host.commands.node",
        "guestagent.host.node.daemon",
        "guestagent.host.vmm.connect",
    ),
    # Never on a node: the guest's daemon, its operations and its state, the VM harness and
    # this build.
    forbidden=(
        "guestagent.agent",
        "guestagent.ops",
        "guestagent.linux.statestore",
        "guestagent.vm",
        "guestagent.build",
    ),
    tools=(),
    dlopened=(LIBGCC,),
    trace=NODE_TRACE,
    command="guestctl",
    entry=("guestagent.host.entry", "entry"),
    sanity="guestagent.host.ctl, guestagent.host.node.daemon, guestagent.host.vmm.qemu, "
    "guestagent.host.metrics.server",
)

TREES = {"guest": GUEST, "node": NODE}


class BuildError(RuntimeError):
    """The tree cannot be built as asked; the message names what and why."""


@dataclass
class Summary:
    modules: int = 0
    dropped_extensions: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()
    missing_imports: int = 0


def library_dirs(debs: Path, target: Target) -> list[Path]:
    return [debs / "lib" / target.triplet, debs / "usr/lib" / target.triplet, debs / "lib"]


def find_library(name: str, debs: Path, target: Target) -> Path | None:
    for directory in library_dirs(debs, target):
        if (directory / name).exists():
            return (directory / name).resolve()
    return None


def needed_closure(
    start: Iterable[Path], debs: Path, target: Target
) -> tuple[dict[str, Path], set[str]]:
    """The shared libraries start needs, directly or not, from the unpacked packages."""
    found: dict[str, Path] = {}
    missing: set[str] = set()
    pending = [name for path in start for name in elf.parse_elf(path.read_bytes()).needed]
    while pending:
        name = pending.pop()
        if name in found or name in missing:
            continue
        path = find_library(name, debs, target)
        if path is None:
            missing.add(name)
            continue
        found[name] = path
        pending.extend(elf.parse_elf(path.read_bytes()).needed)
    return found, missing


def loadable(path: Path, debs: Path, target: Target) -> bool:
    return not needed_closure([path], debs, target)[1]


def copy_file(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, dest, follow_symlinks=True)


def patch_executable(path: Path, prefix: PurePosixPath, target: Target) -> None:
    """The tree's loader, and the tree's lib/ searched first for every library the process
    loads (DT_RPATH, not DT_RUNPATH: glibc applies an executable's RPATH to the libraries
    and extension modules it loads too)."""
    subprocess.run(
        [
            "patchelf",
            "--set-interpreter",
            str(prefix / LAYOUT.lib / target.loader),
            "--force-rpath",
            "--set-rpath",
            str(prefix / LAYOUT.lib),
            str(path),
        ],
        check=True,
    )


def forbidden_in(modules: Iterable[str], spec: TreeSpec) -> str:
    """The modules of `modules` the spec forbids, named; "" when none is."""
    return ", ".join(
        sorted(n for n in modules if any(n == f or n.startswith(f + ".") for f in spec.forbidden))
    )


def unpack_package(wheel: Path, into: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith("guestagent/"):
                archive.extract(member, into)


# -I: the machine's PYTHON* variables and user site never reach the program; -S: no site
# module (it looks the user up through the machine's NSS modules); -B: a read-only tree stays
# unwritten; -OO: no docstrings or asserts in memory (1.1 MiB of the agent's RssAnon; neither
# program reads them); -X utf8: UTF-8 whatever the locale.
INTERPRETER_FLAGS = "-ISBOOXutf8"


def entry_script(prefix: PurePosixPath, spec: TreeSpec) -> str:
    """The program's command. The kernel runs the shebang itself: no shell, no env. Any locale
    but C makes glibc load the machine's locale data and charset modules, built for the
    machine's glibc, so the script starts itself again with LC_ALL=C unless its parent (a
    unit, components.toml, a container's environment) already set it."""
    site = prefix / LAYOUT.site
    module, function = spec.entry
    return (
        f"#!{prefix / LAYOUT.bin / 'python3.11'} {INTERPRETER_FLAGS}\n"
        "import os\n"
        "import sys\n\n"
        'if os.environ.get("LC_ALL") != "C":\n'
        '    os.execve(sys.argv[0], sys.argv, {**os.environ, "LC_ALL": "C"})\n'
        f'sys.path.append("{site}")\n'
        f"from {module} import {function}  # noqa: E402\n\n"
        f"sys.exit({function}())\n"
    )


def ship_modules(
    modules: dict[str, Module],
    sources: dict[str, Path],
    dest: Path,
    debs: Path,
    target: Target,
) -> tuple[str, ...]:
    """Copy each module to its place in the tree; extension modules whose libraries are not
    in the packages are left out (their Python callers fall back, as hashlib does)."""
    dropped = []
    whole_packages: set[str] = set()
    for name, module in sorted(modules.items()):
        top = name.split(".")[0]
        origin, destination = next(
            (root, dest / place)
            for place, root in sources.items()
            if module.path == root or root in module.path.parents
        )
        if origin == sources[str(LAYOUT.site)]:
            whole_packages.add(top)  # Third-party packages ship whole, data files included.
            continue
        if module.path.is_dir():
            continue  # A namespace package: its modules bring the directory.
        if module.path.suffix == ".so" and not loadable(module.path, debs, target):
            dropped.append(name)
            continue
        copy_file(module.path, destination / module.path.relative_to(origin))
    site = sources[str(LAYOUT.site)]
    for top in sorted(whole_packages):
        source = site / top
        if source.is_dir():
            shutil.copytree(source, dest / LAYOUT.site / top, dirs_exist_ok=True)
        else:
            copy_file(source.with_suffix(".py"), dest / LAYOUT.site / f"{top}.py")
    for info in sorted(site.glob("*.dist-info")):
        record = (info / "RECORD").read_text() if (info / "RECORD").exists() else ""
        if any(line.split("/")[0] in whole_packages for line in record.splitlines()):
            shutil.copytree(info, dest / LAYOUT.site / info.name, dirs_exist_ok=True)
    return tuple(dropped)


def staged_command(
    dest: Path, target: Target, python: Path, args: Sequence[str], host_machine: str
) -> list[str]:
    """The command that runs an interpreter through the tree's own loader and libraries.

    On another machine's build host the target's own interpreter still runs, under
    qemu-user named explicitly (no binfmt_misc needed): the built-in modules, the imports
    C code makes and the bytecode come from the very interpreter that ships, so they are
    the same whichever host builds the tree."""
    loader = [str(dest / LAYOUT.lib / target.loader), "--library-path", str(dest / LAYOUT.lib)]
    emulator = [] if target.machine == host_machine else [target.emulator]
    return [*emulator, *loader, str(python), *args]


def run_staged(dest: Path, target: Target, python: Path, *args: str) -> str:
    """Run an interpreter through the tree's own loader and libraries, before the tree is
    installed at its prefix (the patched loader path does not exist on the build host)."""
    command = staged_command(dest, target, python, args, platform.machine())
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BuildError(f"{' '.join(args)} in the staged tree failed: {result.stderr.strip()}")
    return result.stdout


def elf_files_in(root: Path) -> list[Path]:
    return [p for p in sorted(root.rglob("*")) if p.is_file() and elf.is_elf(p.read_bytes()[:4])]


def stage_libraries(paths: Iterable[Path], debs: Path, dest: Path, target: Target) -> None:
    """Put what paths need, as far as the packages have it, in the tree's lib/ before the
    staged interpreter loads them; what is missing is the final closure's to report."""
    for name, path in needed_closure(paths, debs, target)[0].items():
        copy_file(path, dest / LAYOUT.lib / name)


def copy_licenses(debs: Path, dest: Path, packages: Sequence[str]) -> None:
    for package in packages:
        copyright_file = debs / "usr/share/doc" / package / "copyright"
        if copyright_file.exists():
            copy_file(copyright_file, dest / "share/doc" / package / "copyright")


def assemble(
    debs: Path,
    site: Path,
    wheel: Path,
    prefix: PurePosixPath,
    dest: Path,
    target: Target,
    spec: TreeSpec = GUEST,
) -> Summary:
    if dest.exists():
        shutil.rmtree(dest)
    summary = Summary()
    stdlib_source = debs / "usr/lib/python3.11"
    copy_file(debs / "usr/bin/python3.11", dest / LAYOUT.bin / "python3.11")
    for tool in spec.tools:
        copy_file(debs / "sbin" / tool, dest / LAYOUT.sbin / tool)

    with tempfile.TemporaryDirectory() as scratch:
        package_source = Path(scratch)
        unpack_package(wheel, package_source)
        builtins = frozenset(
            stdlib_builtins(debs, dest, target, [dest / LAYOUT.bin / "python3.11"])
        )
        search = [package_source, site, stdlib_source, stdlib_source / "lib-dynload"]
        # The trace loads extension modules, and under qemu-user the loader has no host
        # directories to fall back on: what they need must be in the tree (aarch64's cygrpc
        # needs librt, _ctypes libffi).
        extensions = elf_files_in(site) + elf_files_in(stdlib_source / "lib-dynload")
        stage_libraries(extensions, debs, dest, target)
        loaded = traced_imports(debs, dest, target, [package_source, site], spec.trace)
        modules, missing = closure(
            [*spec.roots, *STARTUP_MODULES, *CODECS, *loaded],
            search,
            target.extension_suffixes,
            builtins,
            NEVER_IMPORTED,
        )
        leaked = forbidden_in(modules, spec)
        if leaked:
            raise BuildError(f"the {spec.name} imports modules it must not carry: {leaked}")
        summary.modules = len(modules)
        summary.missing_imports = len({m.split(".")[0] for m in missing})
        sources = {
            str(LAYOUT.site / "guestagent"): package_source / "guestagent",
            str(LAYOUT.site): site,
            str(LAYOUT.dynload): stdlib_source / "lib-dynload",
            str(LAYOUT.stdlib): stdlib_source,
        }
        summary.dropped_extensions = ship_modules(modules, sources, dest, debs, target)

    shutil.rmtree(dest / LAYOUT.site / "bin", ignore_errors=True)
    libraries, unresolved = needed_closure(elf_files_in(dest), debs, target)
    for name in spec.dlopened:
        libraries[name] = find_library(name, debs, target) or Path("/nonexistent")
    unresolved |= {n for n, p in libraries.items() if not p.exists()}
    if unresolved:
        raise BuildError(f"libraries not in the packages: {', '.join(sorted(unresolved))}")
    for name, path in sorted(libraries.items()):
        copy_file(path, dest / LAYOUT.lib / name)
    summary.libraries = tuple(sorted(libraries))

    tools = [dest / LAYOUT.sbin / tool for tool in spec.tools]
    for executable in [dest / LAYOUT.bin / "python3.11", *tools]:
        patch_executable(executable, prefix, target)
    (dest / LAYOUT.bin / "python").symlink_to("python3.11")
    (dest / LAYOUT.bin / "python3").symlink_to("python3.11")
    script = dest / LAYOUT.bin / spec.command
    script.write_text(entry_script(prefix, spec))
    script.chmod(0o755)

    compile_tree(dest, prefix, debs, target)
    # The trimmed tree must at least start the program's modules.
    python = dest / LAYOUT.bin / "python3.11"
    run_staged(dest, target, python, "-IBOO", "-c", f"import {spec.sanity}")
    versions = (debs.parent / "versions.txt").read_text()
    copy_licenses(debs, dest, [line.split()[0] for line in versions.splitlines() if line])
    (dest / LAYOUT.share).mkdir(parents=True, exist_ok=True)
    (dest / LAYOUT.share / "packages.txt").write_text(versions)
    return summary


def compile_tree(dest: Path, prefix: PurePosixPath, debs: Path, target: Target) -> None:
    """A guest's tree is read-only (EROFS) or a throwaway copy, so bytecode is compiled here,
    by the packages' own interpreter, as unchecked-hash pycs: valid whatever mtimes unpacking
    gives the sources, and the same bytes from the same inputs. The stdlib ships as bytecode
    alone (4 MB less; its frames in a traceback show no source line), optimized as the
    agent's -OO wants it (a sourceless pyc loads whatever the flags). The agent and its
    libraries keep their sources beside it, and bytecode for both levels: -OO for the agent,
    plain for anything else that runs on the tree (guestctl in a test image). No code object
    carries column positions (PEP 657's, for a traceback's ^^^ marks): in every guest's
    memory they were 0.2 MiB of the agent's 3.2 MiB of code objects at start."""
    python = debs / "usr/bin/python3.11"
    common = ["-X", "no_debug_ranges", "-S", "-I", "-m", "compileall", "-q"]
    common += ["-s", str(dest), "-p", str(prefix)]
    common += ["--invalidation-mode", "unchecked-hash"]
    run_staged(dest, target, python, *common, "-o", "2", "-b", str(dest / LAYOUT.stdlib))
    run_staged(dest, target, python, *common, "-o", "0", "-o", "2", str(dest / LAYOUT.site))
    for source in (dest / LAYOUT.stdlib).rglob("*.py"):
        source.unlink()


def stdlib_builtins(debs: Path, dest: Path, target: Target, executables: list[Path]) -> list[str]:
    """The interpreter's built-in modules, as the staged interpreter itself reports them."""
    libraries, missing = needed_closure(executables, debs, target)
    if missing:
        raise BuildError(f"the interpreter needs libraries not in the packages: {sorted(missing)}")
    for name, path in libraries.items():
        copy_file(path, dest / LAYOUT.lib / name)
    loader = find_library(target.loader, debs, target)
    if loader is None:
        raise BuildError(f"no {target.loader} in the packages")
    copy_file(loader, dest / LAYOUT.lib / target.loader)
    # The packages' own interpreter, beside its whole stdlib, on the tree's loader and libraries.
    out = run_staged(
        dest,
        target,
        debs / "usr/bin/python3.11",
        "-S",
        "-I",
        "-c",
        "import sys; print(*sys.builtin_module_names)",
    )
    return out.split()


def traced_imports(
    debs: Path, dest: Path, target: Target, path: list[Path], trace: str
) -> list[str]:
    """The modules the spec's trace loads, traced in the packages' own interpreter with its
    whole stdlib."""
    python = debs / "usr/bin/python3.11"
    return run_staged(dest, target, python, "-S", "-I", "-c", trace, *map(str, path)).split()


def check(tree: Path, prefix: PurePosixPath, machine: str) -> tuple[list[str], list[str]]:
    """The ELF check: the report lines (every file checked) and the problems found."""
    resolved = elf.resolve(elf.scan_tree(tree, prefix), prefix)
    return list(elf.report(resolved)), elf.problems(resolved, machine)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m guestagent.build.runtime")
    parser.add_argument(
        "--tree", default="guest", choices=sorted(TREES), help="whose tree (default guest)"
    )
    parser.add_argument("--debs", type=Path, required=True, help="the unpacked Debian packages")
    parser.add_argument("--site", type=Path, required=True, help="the pinned wheels, installed")
    parser.add_argument("--wheel", type=Path, required=True, help="the guestagent wheel")
    parser.add_argument("--prefix", required=True, help="where the tree lives when installed")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--machine", default="x86_64", choices=sorted(TARGETS))
    args = parser.parse_args(argv)
    target = TARGETS[args.machine]
    prefix = PurePosixPath(args.prefix)
    try:
        summary = assemble(
            args.debs, args.site, args.wheel, prefix, args.out, target, TREES[args.tree]
        )
    except BuildError as e:
        print(f"runtime: {e}", file=sys.stderr)
        return 1
    lines, problems = check(args.out, prefix, target.machine)
    print(
        f"runtime: {args.out} for {prefix}: {summary.modules} modules, "
        f"libraries {' '.join(summary.libraries)}"
    )
    if summary.dropped_extensions:
        print(
            "runtime: left out (their libraries are not shipped):",
            *summary.dropped_extensions,
        )
    print(f"runtime: ELF check, {len(lines)} files:")
    for line in lines:
        print(f"  {line}")
    for problem in problems:
        print(f"runtime: ELF check: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
