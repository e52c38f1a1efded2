"""The package's import contracts: the tree is the architecture, and these keep it so.

Every import in guestagent/ is read from the source (function-level ones too, since a lazy
import is still a dependency), so a violation fails here whether or not the code runs.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sitelessprobe import siteless_command

PACKAGE = Path(__file__).resolve().parents[2] / "guestagent"

# Leaf modules at the top of the package that any layer may use: what both sides of the vsock
# share. A guest-only module lives on the guest side (linux/, ops/, agent/).
SHARED = {"errors", "jsonlog", "transport", "sizes", "records", "load_on_use", "help_formatter"}
# The agent's own state files (/run/guestagent): kept by ops/ and agent/, built on linux/.
STATE_STORE = "guestagent.linux.statestore"
# The byte units: the one module the build may share with the agent.
UNITS = "guestagent.sizes"
GRPC_OR_CONTRACT = (
    "grpc",
    "grpc_health",
    "grpc_reflection",
    "google.protobuf",
    "google.rpc",
    "guestagent.v1",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from guestagent.linux import syscalls` depends on guestagent.linux.syscalls.
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] in SHARED:
        return "shared"
    if parts[1] == "__main__":  # `python -m guestagent` is the daemon's command line.
        return "agent"
    return parts[1]


def within(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


SOURCES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "_pb2" not in p.name}


# host/'s wings, each a job of its own, and the others' modules each may import (below
# guestagent.host). host/'s shared modules at its root (the client, text, sizes, streams)
# are open to every wing and import none.
HOST_WINGS: dict[str, tuple[str, ...]] = {
    "vmm": (),
    "giveback": ("vmm", "metrics.server", "metrics.families"),
    "metrics": (),
    "sizing": ("vmm.rss",),
    "node": ("vmm", "giveback", "metrics"),
    "commands": ("vmm", "giveback", "metrics", "sizing", "node"),
    "ctl": ("commands",),
    "entry": ("ctl",),
}
HOST = "guestagent.host"


def host_wing(module: str) -> str | None:
    """The wing of host/ a module is in; "" for host/'s shared root; None outside host/."""
    if not within(module, HOST) or module == HOST:
        return None if module != HOST else ""
    wing = module.split(".")[2]
    return wing if wing in HOST_WINGS else ""


def wing_violation(module: str, target: str) -> str | None:
    own, theirs = host_wing(module), host_wing(target)
    if own is None or not theirs or own == theirs:
        return None
    if own == "":
        return f"{module} imports {target}: host/'s shared modules import no wing"
    allowed = tuple(f"{HOST}.{name}" for name in HOST_WINGS[own])
    if not within(target, *allowed):
        return f"{module} imports {target}: host/{own} does not reach into host/{theirs}"
    return None


def violations() -> list[str]:
    found = []
    for module, path in SOURCES.items():
        own = layer(module)
        for target in sorted(imports_of(path)):
            theirs = layer(target) if target.startswith("guestagent") else None
            breach = wing_violation(module, target)
            if breach is not None:
                found.append(breach)
            if own in ("linux", "ops") and within(target, *GRPC_OR_CONTRACT):
                found.append(f"{module} imports {target}: linux/ops never touch gRPC or v1")
            if own == "linux" and theirs in ("ops", "agent", "host", "vm"):
                found.append(f"{module} imports {target}: linux/ is the bottom layer")
            if own == "ops" and theirs in ("agent", "host", "vm"):
                found.append(f"{module} imports {target}: ops/ knows no daemon or host")
            if own in ("ops", "agent") and within(target, "guestagent.linux.fs"):
                found.append(f"{module} imports {target}: ops/ and agent/ hold a Kernel, not files")
            if own == "shared" and theirs not in (None, "shared", "v1"):
                found.append(f"{module} imports {target}: shared modules stay leaf-ward")
            if {own, theirs} == {"agent", "host"}:
                found.append(f"{module} imports {target}: agent and host never import each other")
            if theirs == "build" and own != "build":
                found.append(f"{module} imports {target}: the guest build is a tool, not a library")
            if own == "build" and theirs not in (None, "build") and not within(target, UNITS):
                found.append(f"{module} imports {target}: the build needs nothing of the agent")
            if within(target, STATE_STORE) and own not in ("ops", "agent"):
                found.append(f"{module} imports {target}: only the agent keeps state")
            if own == "host" and theirs == "vm":
                found.append(f"{module} imports {target}: host/ is the product, vm/ builds on it")
            elif theirs == "vm" and own != "vm":
                found.append(f"{module} imports {target}: only vm/ and tests use the harness")
    return found


# Only linux/ knows the kernel: ops/ and agent/ name no kernel file, parse no kernel text and
# run no process (linux/tools.py runs them).
KNOWS_NO_KERNEL = ("ops", "agent")
KERNEL_PATHS = {"proc", "sys", "dev"}  # KernelFS's methods that name a kernel file.
# KernelFS's file access: a Kernel is a KernelFS, so only linux/ may call these on it.
FILE_ACCESS = {"read", "read_bytes", "read_optional", "read_parsed", "read_int", "write", "open"}
FILE_ACCESS |= {"exists", "is_dir", "listdir", "subdirectories", "mkdir", "rmdir", "host_path"}
PROCESS_MODULES = {"subprocess", "multiprocessing", "pty"}
OS_PROCESS_CALLS = {"sysconf", "system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp"}
# A kernel file named as a whole string: absolute, or a cgroup's file relative to its directory.
KERNEL_FILE = re.compile(
    r"/(proc|sys|dev)(/.*)?"
    r"|(cgroup|memory|cpu|io|pids)\.(procs|threads|controllers|subtree_control|type|events"
    r"|events\.local|stat|current|min|low|high|max|peak|pressure|reclaim|oom\.group"
    r"|swap\.(current|max|high|peak|events)|zswap\.(current|max))"
)


def kernel_knowledge(path: Path) -> list[str]:
    """What a module knows of the kernel, each as 'line: what'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name, owner = node.func.attr, node.func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else None
            if name in KERNEL_PATHS and owner_name != "os":
                found.append(f"{line}: names a kernel path (.{name}())")
            holder = owner_name or getattr(owner, "attr", None)
            if name in FILE_ACCESS and holder in ("fs", "kernel"):
                found.append(f"{line}: touches a kernel file itself ({holder}.{name}())")
            if owner_name == "os" and (
                name in OS_PROCESS_CALLS or name.startswith(("exec", "spawn"))
            ):
                found.append(f"{line}: asks the kernel directly (os.{name})")
            if owner_name == "asyncio" and name.startswith("create_subprocess"):
                found.append(f"{line}: runs a process (asyncio.{name})")
        elif isinstance(node, ast.Attribute) and node.attr == "cgroup_root":
            found.append(f"{line}: names a kernel path (.cgroup_root)")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names]
            modules = names if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                if module.split(".")[0] in PROCESS_MODULES:
                    found.append(f"{line}: runs a process (imports {module})")
            if isinstance(node, ast.ImportFrom) and within(node.module or "", "guestagent.linux"):
                found += [
                    f"{line}: parses kernel text (imports {name})"
                    for name in names
                    if name.startswith("parse_")
                ]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "parse_"
        ):
            found.append(f"{line}: defines a kernel-text parser ({node.name})")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and (
                node.value.startswith(("/proc/", "/sys/", "/dev/"))
                or KERNEL_FILE.fullmatch(node.value)
            )
        ):
            found.append(f"{line}: names a kernel path ({node.value!r})")
    return found


def kernel_violations() -> list[str]:
    return [
        f"{module}:{what}: only linux/ knows the kernel"
        for module, path in SOURCES.items()
        if layer(module) in KNOWS_NO_KERNEL
        for what in kernel_knowledge(path)
    ]


# A checked value, and the one module whose check makes it: whoever holds one never checks it
# again, so nothing else may make one (nor claim one with cast).
CHECKED_VALUES = {"CgroupName": "guestagent.linux.cgroup.name"}
NOT_MAKING = {"isinstance", "issubclass"}


def unchecked_values() -> list[str]:
    """Checked values made, or cast to, outside their checks, each as 'module:line: what'."""
    found = []
    for module, path in SOURCES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if called in NOT_MAKING:
                continue
            named = {called, *(getattr(arg, "id", "") for arg in node.args)}
            for value in CHECKED_VALUES.keys() & named:
                if module != CHECKED_VALUES[value]:
                    found.append(f"{module}:{node.lineno}: makes a {value} its check did not")
    return found


def test_every_module_is_in_a_layer() -> None:
    layers = {layer(m) for m in SOURCES}
    assert layers <= {
        "shared",
        "linux",
        "ops",
        "agent",
        "host",
        "vm",
        "v1",
        "build",
    }, layers


def test_import_contracts_hold() -> None:
    assert violations() == []


def test_only_linux_knows_the_kernel() -> None:
    assert kernel_violations() == []


def test_checked_values_are_made_by_their_checks_alone() -> None:
    assert unchecked_values() == []


def plant(planted: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Add modules to the tree the checkers read, as if they were in guestagent/."""
    fake = dict(SOURCES)
    for name, text in planted.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        fake[name] = path
    monkeypatch.setattr(sys.modules[__name__], "SOURCES", fake)


def test_the_checker_sees_a_violation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A contract test that cannot fail proves nothing: plant one breach of each kind."""
    planted = {
        "guestagent.ops.planted": "import grpc\nfrom guestagent.agent import rpc\n",
        "guestagent.linux.planted": "from guestagent.ops import swap\n",
        "guestagent.host.planted": (
            "def f():\n    from guestagent.agent.wire import x\n"
            "    from guestagent.vm import qemu\n"
        ),
        "guestagent.agent.planted": "from guestagent.vm import qemu\n",
        "guestagent.build.planted": "from guestagent.linux import fs\n",
        "guestagent.ops.planted_fs": "from guestagent.linux.fs import KernelFS\n",
        "guestagent.agent.planted_fs": "from guestagent.linux import fs\n",
        "guestagent.host.vmm.planted": "from guestagent.host.giveback import plan\n",
        "guestagent.host.metrics.planted": "from guestagent.host.giveback.follow import Change\n",
        "guestagent.host.giveback.planted": (
            "from guestagent.host.metrics.server import MetricsServer\n"
            "from guestagent.host.metrics.feed import WatchFeed\n"
            "from guestagent.host.commands import common\n"
        ),
        "guestagent.host.sizing.planted": "from guestagent.host.vmm.qemu import QemuVmm\n",
        "guestagent.host.planted_root": "from guestagent.host.vmm.base import Vmm\n",
        "guestagent.linux.planted_store": "from guestagent.linux import statestore\n",
        "guestagent.host.planted_store": "from guestagent.linux.statestore import state_file\n",
        STATE_STORE: "from guestagent.ops import swap\n",
    }
    plant(planted, tmp_path, monkeypatch)
    found = "\n".join(violations())
    for expected in (
        "guestagent.ops.planted imports grpc",
        "guestagent.ops.planted imports guestagent.agent.rpc",
        "guestagent.linux.planted imports guestagent.ops.swap",
        "guestagent.host.planted imports guestagent.agent.wire",
        "guestagent.host.planted imports guestagent.vm.qemu: host/ is the product",
        "guestagent.agent.planted imports guestagent.vm.qemu",
        "guestagent.build.planted imports guestagent.linux.fs",
        "guestagent.ops.planted_fs imports guestagent.linux.fs: ops/ and agent/ hold a Kernel",
        "guestagent.agent.planted_fs imports guestagent.linux.fs: ops/ and agent/ hold a Kernel",
        "guestagent.host.vmm.planted imports guestagent.host.giveback.plan: host/vmm does not",
        "guestagent.host.metrics.planted imports guestagent.host.giveback.follow: host/metrics",
        "guestagent.host.giveback.planted imports guestagent.host.metrics.feed: host/giveback",
        "guestagent.host.giveback.planted imports guestagent.host.commands.common: host/giveback",
        "guestagent.host.sizing.planted imports guestagent.host.vmm.qemu: host/sizing does not",
        "guestagent.host.planted_root imports guestagent.host.vmm.base: host/'s shared modules",
        "guestagent.linux.planted_store imports guestagent.linux.statestore: only the agent",
        "guestagent.host.planted_store imports guestagent.linux.statestore: only the agent",
        f"{STATE_STORE} imports guestagent.ops.swap: linux/ is the bottom layer",
    ):
        assert expected in found
    # What a wing may reach is no breach: follow's metrics serve through metrics/server.py.
    assert "guestagent.host.metrics.server: host/giveback" not in found


def test_the_kernel_checker_sees_a_breach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planted = {
        "guestagent.ops.planted": (
            "import subprocess\n"
            "from guestagent.linux.keyed import parse_flat_keyed\n"
            "def parse_buddyinfo(text): ...\n"
            "def f(fs):\n"
            "    fs.read(fs.proc('buddyinfo'))\n"
            "    return os.sysconf('SC_PAGE_SIZE')\n"
            "def g(self): self.fs.write(self.fs.cgroup_root, '+memory')\n"
            "def h(kernel, path): return kernel.exists(path)\n"
        ),
        "guestagent.agent.planted": "PATH = '/sys/kernel/mm'\ndef g(fs): fs.sys('x')\n",
        "guestagent.agent.planted_name": (
            "def watch(memory): return memory.directory / 'memory.events'\n"
            "CONTROL, PROC = 'memory.reclaim', '/proc'\n"
            "FIELD = 'memory.swap'  # The OCI spec's field, not a file: not a breach.\n"
        ),
        "guestagent.linux.planted": "import subprocess\ndef parse_x(fs): fs.proc('x')\n",
    }
    plant(planted, tmp_path, monkeypatch)
    found = "\n".join(kernel_violations())
    for expected in (
        "guestagent.ops.planted:1: runs a process (imports subprocess)",
        "guestagent.ops.planted:2: parses kernel text (imports parse_flat_keyed)",
        "guestagent.ops.planted:3: defines a kernel-text parser (parse_buddyinfo)",
        "guestagent.ops.planted:5: names a kernel path (.proc())",
        "guestagent.ops.planted:6: asks the kernel directly (os.sysconf)",
        "guestagent.ops.planted:5: touches a kernel file itself (fs.read())",
        "guestagent.ops.planted:7: touches a kernel file itself (fs.write())",
        "guestagent.ops.planted:7: names a kernel path (.cgroup_root)",
        "guestagent.ops.planted:8: touches a kernel file itself (kernel.exists())",
        "guestagent.agent.planted:1: names a kernel path ('/sys/kernel/mm')",
        "guestagent.agent.planted:2: names a kernel path (.sys())",
        "guestagent.agent.planted_name:1: names a kernel path ('memory.events')",
        "guestagent.agent.planted_name:2: names a kernel path ('memory.reclaim')",
        "guestagent.agent.planted_name:2: names a kernel path ('/proc')",
    ):
        assert expected in found
    assert "planted_name:3" not in found
    assert "guestagent.linux.planted" not in found


def test_the_value_checker_sees_a_breach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planted = {
        "guestagent.ops.planted": (
            "from typing import cast\n"
            "from guestagent.linux.cgroup.name import CgroupName\n"
            "ESCAPE = CgroupName('../etc')\n"
            "CLAIMED = cast(CgroupName, '/sys')\n"
            "def f(x): return isinstance(x, CgroupName)\n"
        ),
        "guestagent.agent.planted": (
            "from guestagent.linux.cgroup import name\nEMPTY = name.CgroupName('')\n"
        ),
    }
    plant(planted, tmp_path, monkeypatch)
    assert sorted(unchecked_values()) == [
        "guestagent.agent.planted:2: makes a CgroupName its check did not",
        "guestagent.ops.planted:3: makes a CgroupName its check did not",
        "guestagent.ops.planted:4: makes a CgroupName its check did not",
    ]


def run_probe(probe: str) -> str:
    """What a fresh interpreter running `probe` prints."""
    return subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout


def test_the_daemon_loads_no_host_or_harness_code() -> None:
    """What `guestagent serve` imports at start is what every guest pays for in memory."""
    probe = (
        "import sys, guestagent.agent.cli\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('guestagent')))"
    )
    loaded = run_probe(probe).split()
    assert [m for m in loaded if within(m, "guestagent.host", "guestagent.vm")] == []


def test_guestctl_loads_no_sizing_measure_or_harness_code_at_start() -> None:
    """guestctl also runs in the guest (it is in the image's venv), which carries neither
    host/sizing nor host/measure (nor the QEMU boot it uses) nor vm/, nor qemu.qmp, which
    host/qmp brings: only the commands that need them import them (give-back its VMM's
    backend and the follow loop)."""
    probe = (
        "import sys, guestagent.host.ctl\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('guestagent')))"
    )
    loaded = run_probe(probe).split()
    heavy = (
        "guestagent.host.sizing",
        "guestagent.host.sizing.measure",
        "guestagent.host.sizing.boot",
        "guestagent.host.giveback",
        "guestagent.host.giveback.follow",
        "guestagent.host.vmm.qemu",
        "guestagent.host.vmm.cloud_hypervisor",
        "guestagent.host.vmm.firecracker",
        "guestagent.vm",
    )
    assert [m for m in loaded if within(m, *heavy)] == []


def test_the_daemon_loads_no_ssl_and_no_start_time_only_stdlib() -> None:
    """entry() blocks ssl before asyncio can import it, so nothing before it may import
    asyncio; the command line's parser brings no shutil (argparse's width lookup would); and
    modules a rare call needs (uuid for mkswap, reflection's descriptors for
    grpcurl, pyudev for a swap disk by serial) load only then."""
    probe = (
        "import sys, guestagent.agent.cli as cli\n"
        "assert 'asyncio' not in sys.modules and 'ssl' not in sys.modules\n"
        "sys.modules.setdefault('ssl', None)\n"
        "import guestagent.agent.daemon\n"
        "cli.build_parser().parse_args(['serve'])\n"
        "heavy = ('ssl', '_ssl', 'uuid', 'platform', 'tempfile', 'shutil', 'bz2', 'lzma',\n"
        "         'random',\n"
        "         'grpc_reflection.v1alpha', 'pyudev')\n"
        "print(' '.join(m for m in heavy if sys.modules.get(m)))"
    )
    loaded = run_probe(probe).split()
    assert loaded == []


def test_the_daemon_runs_none_of_protobufs_pure_python_implementation() -> None:
    """entry() has protobuf's python_message imported without being run: the contract's and
    the health service's messages encode and decode under upb with it and text_format
    unloaded, and the first read of it still gets the whole module."""
    probe = (
        "import sys\n"
        "from guestagent.load_on_use import PROTOBUF_PURE_PYTHON, load_on_use\n"
        "load_on_use(PROTOBUF_PURE_PYTHON)\n"
        "import guestagent.agent.daemon\n"
        "from google.protobuf.internal import api_implementation\n"
        "from grpc_health.v1 import health_pb2\n"
        "from guestagent.v1 import agent_pb2\n"
        "info = agent_pb2.MemoryInfo(system=agent_pb2.SystemMemory(mem_total_bytes=1 << 30))\n"
        "back = agent_pb2.MemoryInfo.FromString(info.SerializeToString())\n"
        "ok = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)\n"
        "name = 'google.protobuf.internal.python_message'\n"
        "print(api_implementation.Type(), back.system.mem_total_bytes, ok.SerializeToString())\n"
        "print(type(sys.modules[name]).__name__, 'google.protobuf.text_format' in sys.modules)\n"
        "print(callable(sys.modules[name]._AttachFieldHelpers),\n"
        "      'google.protobuf.text_format' in sys.modules)"
    )
    assert run_probe(probe).splitlines() == [
        "upb 1073741824 b'\\x08\\x01'",
        "_LazyModule False",
        "True True",
    ]


def test_the_wire_encodes_maps_without_descriptor_protos_message_classes() -> None:
    """Encoding reads map fields off the messages themselves: asking a descriptor for its
    options (map_entry) would load descriptor_pb2, 0.48 MiB that nothing else in the agent
    uses. Every declared pair's plan is built (test_wire.py encodes CompactResult's map)."""
    probe = (
        "import sys\n"
        "from guestagent.agent import encoding, wire\n"
        "for domain in encoding.PAIRS:\n"
        "    encoding._plan(domain)\n"
        "print(len(encoding._PLANS) == len(encoding.PAIRS) > 20,\n"
        "      'google.protobuf.descriptor_pb2' in sys.modules)"
    )
    assert run_probe(probe).splitlines() == ["True False"]


def test_protobufs_timestamps_load_calendar_only_when_used() -> None:
    """upb imports the well-known types with the first message class, and they import
    calendar, read only by Timestamp's conversions: deferred by entry(), it stays unrun
    through the contract's messages, and a Timestamp still converts."""
    probe = (
        "import sys\n"
        "from guestagent.load_on_use import LOADED_ON_USE, load_on_use\n"
        "load_on_use(LOADED_ON_USE)\n"
        "from guestagent.v1 import agent_pb2\n"
        "agent_pb2.MemoryInfo.FromString(agent_pb2.MemoryInfo(reason=1).SerializeToString())\n"
        "print(type(sys.modules['calendar']).__name__)\n"
        "import datetime\n"
        "from google.protobuf.timestamp_pb2 import Timestamp\n"
        "stamp = Timestamp()\n"
        "stamp.FromDatetime(datetime.datetime(2026, 12, 6, tzinfo=datetime.timezone.utc))\n"
        "print(stamp.seconds, type(sys.modules['calendar']).__name__)"
    )
    assert run_probe(probe).splitlines() == ["_LazyModule", "1796515200 module"]


def test_the_entry_module_imports_nothing_it_must_come_before() -> None:
    """agent/entry.py refuses ssl and defers modules before the command's imports, so its own
    may bring none of them, nor what imports them: pathlib imports urllib.parse, which imports
    ipaddress, which the agent reads only to check a tcp listener. The agent's own modules
    bring none of the three: its kernel paths are strings."""
    probe = (
        "import sys, guestagent.agent.entry\n"
        "watched = ('ssl', 'asyncio', 'pathlib', 'urllib.parse', 'ipaddress', 'google.protobuf',\n"
        "           'guestagent.agent.cli')\n"
        "print(' '.join(m for m in watched if m in sys.modules))"
    )
    done = subprocess.run(siteless_command(probe), check=True, capture_output=True, text=True)
    assert done.stdout.split() == []
    # The command itself, as far as its parse, then the daemon's imports: no pathlib, no
    # urllib.parse, no ipaddress; a tcp listener's loopback check gets the whole module.
    probe = (
        "import sys\n"
        "sys.argv = ['guestagent', 'serve', '--help']\n"
        "from guestagent.agent.entry import entry\n"
        "try:\n"
        "    entry()\n"
        "except SystemExit:\n"
        "    pass\n"
        "import guestagent.agent.daemon\n"
        "from guestagent.transport.address import parse_address\n"
        "seen = [m in sys.modules for m in ('pathlib', 'urllib.parse', 'ipaddress')]\n"
        "seen.append(sys.modules['ssl'])\n"
        "hosts = ('127.0.0.2', '10.0.0.1', '[::1]')\n"
        "seen += [parse_address(f'tcp://{h}:1').is_loopback for h in hosts]\n"
        "print(*seen, type(sys.modules['ipaddress']).__name__, file=sys.stderr)"
    )
    done = subprocess.run(siteless_command(probe), check=True, capture_output=True, text=True)
    absent_then_loopback = ["False", "False", "False", "None", "True", "False", "True", "module"]
    assert done.stderr.split() == absent_then_loopback


def test_the_daemon_keeps_nothing_of_argparse_once_its_options_are_parsed() -> None:
    """entry() drops argparse and gettext after the parse, so their memory goes to the
    daemon's imports: nothing may still hold them (a function or class of theirs keeps its
    module's namespace), and nothing at start may import them again."""
    probe = (
        "import gc, sys, types\n"
        "sys.modules.setdefault('ssl', None)\n"
        "import guestagent.agent.cli as cli\n"
        "options = cli.command_line_options(['serve', '--listen', 'unix:///run/a.sock'])\n"
        "cli.forget_modules(cli.PARSE_ONLY_MODULES)\n"
        "import guestagent.agent.daemon\n"
        "live = gc.get_objects()\n"
        "alive = {o.__module__ for o in live if isinstance(o, types.FunctionType | type)}\n"
        "alive |= {o.__name__ for o in live if isinstance(o, types.ModuleType)}\n"
        "print(' '.join(m for m in cli.PARSE_ONLY_MODULES if m in alive or m in sys.modules))\n"
        "print(options.listen)"
    )
    out = run_probe(probe).splitlines()
    assert out == ["", "['unix:///run/a.sock']"]


# What the node daemon keeps out (docs/measurements.md, the node daemon): http.client and
# http.server, and what they bring, 1.6 MiB of its memory for a GET on a unix socket and two
# paths served; tempfile, shutil and pathlib for a relay's directory, argparse's help width and
# three arguments, and protobuf's json_format for --json output, 2 MiB more with the daemon
# idle. The daemon's own imports, and the backends it follows a balloon through.
NODE_KEEPS_OUT = (
    *("http", "email", "socketserver", "mimetypes", "html"),
    *("tempfile", "shutil", "pathlib", "google.protobuf.json_format"),
)
NODE_IMPORTS = (
    "guestagent.host.ctl",
    "guestagent.host.commands.node",
    "guestagent.host.node.daemon",
    "guestagent.host.metrics.server",
    "guestagent.host.vmm.cloud_hypervisor",
    "guestagent.host.vmm.firecracker",
)


def node_loads(*planted: str, then: str = "") -> list[str]:
    """Each module of NODE_KEEPS_OUT that `guestctl node`'s imports (then `planted`'s) load in
    a fresh interpreter run as the node's runtime runs it (no site, guestctl's entry), as
    'module <- importer'; then what `then` prints."""
    probe = (
        "import sys\n"
        "class Watch:\n"
        "    def find_spec(self, name, path, target=None):\n"
        f"        if any(name == m or name.startswith(m + '.') for m in {NODE_KEEPS_OUT!r}):\n"
        "            frame = sys._getframe(1)\n"
        "            while frame.f_globals['__name__'].startswith(('importlib', '_frozen')):\n"
        "                frame = frame.f_back\n"
        "            print(name, '<-', frame.f_globals['__name__'], file=sys.__stdout__)\n"
        "sys.meta_path.insert(0, Watch())\n"
        "sys.argv = ['guestctl', 'node', '--help']\n"
        "import contextlib, io\n"
        "from guestagent.host.entry import entry\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    entry()  # Its help: the parse, after every command's imports.\n"
        f"for module in {(*NODE_IMPORTS, *planted)!r}:\n"
        "    __import__(module)\n"
        f"{then}"
    )
    done = subprocess.run(siteless_command(probe), check=True, capture_output=True, text=True)
    return done.stdout.splitlines()


def test_the_node_daemon_loads_no_http_client_or_server() -> None:
    assert node_loads() == []


def test_the_node_probe_sees_a_breach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "planted_node_module.py").write_text("import http.client\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = node_loads("planted_node_module")
    assert "http.client <- planted_node_module" in found, found


def test_the_node_daemon_runs_none_of_protobufs_pure_python_or_timestamps() -> None:
    """guestctl's entry defers them as the agent's does: the contract's and the CRI's messages
    and the node's families leave both unrun, 0.5-0.7 MiB (docs/measurements.md)."""
    then = (
        "from guestagent.host.node import cri_pb2\n"
        "from guestagent.host.node.metrics import node_families\n"
        "from guestagent.v1 import agent_pb2\n"
        "info = agent_pb2.MemoryInfo(system=agent_pb2.SystemMemory(mem_total_bytes=1 << 30))\n"
        "back = agent_pb2.MemoryInfo.FromString(info.SerializeToString())\n"
        "cri_pb2.ListPodSandboxRequest.FromString(cri_pb2.ListPodSandboxRequest().SerializeToString())\n"
        "node_families([], {}, None, None)\n"
        "names = ('google.protobuf.internal.python_message', 'calendar')\n"
        "print(back.system.mem_total_bytes, *(type(sys.modules[n]).__name__ for n in names))\n"
    )
    assert node_loads(then=then) == ["1073741824 _LazyModule _LazyModule"]
