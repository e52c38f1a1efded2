"""Every refusal path the servicer can reach over a fake kernel tree, with the status code,
the stable reason (ErrorInfo.reason) and, for INVALID_ARGUMENT, the field a client sees; and
the table of reasons against the code that raises them and docs/contract.md."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from guestagent import errors
from guestagent.agent.rpc import STATUS_BY_ERROR
from guestagent.agent.status import BUG_REASON
from guestagent.host.refusal import refusal_from
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.root import FakeRoot
from tests.fakes.servicer import Aborted, FakeContext, make_servicer

ROOT = Path(__file__).resolve().parents[3]
CODE = grpc.StatusCode


@dataclass(frozen=True)
class Path_:
    method: str
    request: Message
    code: grpc.StatusCode
    reason: str
    field: str = ""
    setup: Callable[[FakeRoot], None] = lambda root: None


def no_psi(root: FakeRoot) -> None:
    (root.root / "proc/pressure/memory").unlink()
    (root.root / "sys/fs/cgroup/pod/memory.pressure").unlink()


def no_memory_controller(root: FakeRoot) -> None:
    (root.root / "sys/fs/cgroup/pod/memory.max").unlink()
    (root.root / "sys/fs/cgroup/pod/memory.current").unlink()


def garbage_current(root: FakeRoot) -> None:
    (root.root / "sys/fs/cgroup/pod/memory.current").write_text("lots\n")


def with_reclaim(root: FakeRoot) -> None:
    (root.root / "sys/fs/cgroup/pod/memory.reclaim").write_text("")


def reclaim_without_psi(root: FakeRoot) -> None:
    with_reclaim(root)
    no_psi(root)


def with_node(root: FakeRoot) -> None:
    root.write("sys/devices/system/node/node0/compact", "")


def memory(**values: Any) -> pb.SetMemoryLimitsRequest:
    return pb.SetMemoryLimitsRequest(cgroup="pod", memory=pb.LinuxMemory(**values))


def watch(**values: Any) -> pb.WatchMemoryRequest:
    return pb.WatchMemoryRequest(**values)


PATHS = [
    # Names.
    Path_(
        "GetMemoryInfo",
        pb.GetMemoryInfoRequest(cgroups=["/abs"]),
        CODE.INVALID_ARGUMENT,
        "CGROUP_PATH_INVALID",
    ),
    Path_(
        "GetMemoryInfo",
        pb.GetMemoryInfoRequest(cgroups=["a/../b"]),
        CODE.INVALID_ARGUMENT,
        "CGROUP_PATH_INVALID",
    ),
    Path_(
        "GetMemoryInfo",
        pb.GetMemoryInfoRequest(cgroups=["gone"]),
        CODE.NOT_FOUND,
        "CGROUP_NOT_FOUND",
    ),
    Path_(
        "GetMemoryInfo",
        pb.GetMemoryInfoRequest(cgroups=["x"] * 1025),
        CODE.INVALID_ARGUMENT,
        "TOO_MANY_NAMES",
        "cgroups",
    ),
    Path_(
        "GetMemoryInfo",
        pb.GetMemoryInfoRequest(cgroups=["pod"]),
        CODE.FAILED_PRECONDITION,
        "MEMORY_CONTROLLER_OFF",
        setup=no_memory_controller,
    ),
    Path_(
        "GetMemoryInfo",
        pb.GetMemoryInfoRequest(cgroups=["pod"]),
        CODE.INTERNAL,
        "KERNEL_FORMAT",
        setup=garbage_current,
    ),
    Path_(
        "GetMemoryInfo",
        pb.GetMemoryInfoRequest(idle_edges_ms=[10, 5]),
        CODE.INVALID_ARGUMENT,
        "IDLE_EDGES_INVALID",
        "idle_edges_ms",
    ),
    Path_(
        "GetMemoryInfo",
        pb.GetMemoryInfoRequest(idle_edges_ms=[0, 5]),
        CODE.INVALID_ARGUMENT,
        "IDLE_EDGES_INVALID",
        "idle_edges_ms",
    ),
    Path_(
        "GetGuestOverhead",
        pb.GetGuestOverheadRequest(workload_cgroups=["gone"]),
        CODE.NOT_FOUND,
        "CGROUP_NOT_FOUND",
    ),
    # Watch streams.
    Path_(
        "WatchMemory",
        watch(interval_ms=50),
        CODE.INVALID_ARGUMENT,
        "WATCH_INTERVAL_TOO_SHORT",
        "interval_ms",
    ),
    Path_(
        "WatchMemory",
        watch(interval_ms=100, cgroups=[f"c{i}" for i in range(200)]),
        CODE.INVALID_ARGUMENT,
        "WATCH_TOO_MANY_CGROUPS",
        "cgroups",
    ),
    Path_(
        "WatchMemory",
        watch(pressure_trigger=pb.PressureTrigger(stall_us=1, window_us=1)),
        CODE.INVALID_ARGUMENT,
        "PRESSURE_TRIGGER_INVALID",
        "pressure_trigger.window_us",
    ),
    Path_(
        "WatchMemory",
        watch(pressure_trigger=pb.PressureTrigger(stall_us=0, window_us=1_000_000)),
        CODE.INVALID_ARGUMENT,
        "PRESSURE_TRIGGER_INVALID",
        "pressure_trigger.stall_us",
    ),
    Path_(
        "WatchMemory",
        watch(pressure_trigger=pb.PressureTrigger(stall_us=1000, window_us=1_000_000)),
        CODE.FAILED_PRECONDITION,
        "STALL_SIGNAL_ABSENT",
        setup=no_psi,
    ),
    Path_(
        "WatchMemory",
        watch(pressure_trigger=pb.PressureTrigger(stall_us=1000, window_us=1_000_000, full=True)),
        CODE.FAILED_PRECONDITION,
        "FULL_STALL_NEEDS_PSI",
        setup=no_psi,
    ),
    Path_("WatchMemory", watch(cgroups=["gone"]), CODE.NOT_FOUND, "CGROUP_NOT_FOUND"),
    # Limits.
    Path_(
        "SetMemoryLimits",
        memory(limit=-2),
        CODE.INVALID_ARGUMENT,
        "LIMIT_VALUE_INVALID",
        "memory.limit",
    ),
    Path_(
        "SetMemoryLimits",
        memory(reservation=-7),
        CODE.INVALID_ARGUMENT,
        "LIMIT_VALUE_INVALID",
        "memory.reservation",
    ),
    Path_(
        "SetMemoryLimits",
        memory(swap=1 << 30),
        CODE.INVALID_ARGUMENT,
        "SWAP_TOTAL_WITHOUT_LIMIT",
        "memory.swap",
    ),
    Path_(
        "SetMemoryLimits",
        memory(limit=2 << 30, swap=1 << 30),
        CODE.INVALID_ARGUMENT,
        "SWAP_TOTAL_BELOW_LIMIT",
        "memory.swap",
    ),
    Path_(
        "SetMemoryLimits",
        memory(kernel=1 << 20),
        CODE.INVALID_ARGUMENT,
        "CGROUP_V1_SETTING",
        "memory",
    ),
    Path_(
        "SetMemoryLimits",
        pb.SetMemoryLimitsRequest(cgroup="gone"),
        CODE.NOT_FOUND,
        "CGROUP_NOT_FOUND",
    ),
    Path_(
        "SetMemoryLimits",
        memory(limit=1 << 30),
        CODE.FAILED_PRECONDITION,
        "MEMORY_CONTROLLER_OFF",
        setup=no_memory_controller,
    ),
    Path_(
        "SetMemoryLimits",
        pb.SetMemoryLimitsRequest(cgroup="", memory=pb.LinuxMemory()),
        CODE.INVALID_ARGUMENT,
        "CGROUP_PATH_INVALID",
    ),
    # Reclaim.
    Path_(
        "Reclaim",
        pb.ReclaimRequest(cgroup="pod", bytes=-5),
        CODE.INVALID_ARGUMENT,
        "RECLAIM_SIZE_INVALID",
        "bytes",
    ),
    Path_(
        "Reclaim",
        pb.ReclaimRequest(cgroup="pod", bytes=5, drop_caches=9),
        CODE.INVALID_ARGUMENT,
        "DROP_CACHES_INVALID",
        "drop_caches",
    ),
    Path_(
        "Reclaim",
        pb.ReclaimRequest(cgroup="pod", bytes=4096),
        CODE.FAILED_PRECONDITION,
        "MEMORY_RECLAIM_ABSENT",
    ),
    Path_(
        "SetReclaimPolicy",
        pb.SetReclaimPolicyRequest(cgroup="pod", enabled=True),
        CODE.FAILED_PRECONDITION,
        "MEMORY_RECLAIM_ABSENT",
    ),
    Path_(
        "SetReclaimPolicy",
        pb.SetReclaimPolicyRequest(cgroup="pod", enabled=True),
        CODE.FAILED_PRECONDITION,
        "STALL_SIGNAL_ABSENT",
        setup=reclaim_without_psi,
    ),
    Path_(
        "SetReclaimPolicy",
        pb.SetReclaimPolicyRequest(cgroup="pod", enabled=True, policy=pb.ReclaimPolicy(anon=True)),
        CODE.FAILED_PRECONDITION,
        "NO_ACTIVE_SWAP",
        setup=with_reclaim,
    ),
    Path_(
        "SetReclaimPolicy",
        pb.SetReclaimPolicyRequest(
            cgroup="pod", enabled=True, policy=pb.ReclaimPolicy(interval_ms=5)
        ),
        CODE.INVALID_ARGUMENT,
        "RECLAIM_POLICY_INVALID",
        "policy.interval_ms",
        setup=with_reclaim,
    ),
    Path_(
        "SetReclaimPolicy",
        pb.SetReclaimPolicyRequest(
            cgroup="pod", enabled=True, policy=pb.ReclaimPolicy(max_step_fraction=2)
        ),
        CODE.INVALID_ARGUMENT,
        "RECLAIM_POLICY_INVALID",
        "policy.max_step_fraction",
        setup=with_reclaim,
    ),
    Path_(
        "GetReclaimStatus",
        pb.GetReclaimStatusRequest(cgroups=["pod"]),
        CODE.NOT_FOUND,
        "NO_RECLAIM_POLICY",
    ),
    # Compaction.
    Path_("Compact", pb.CompactRequest(), CODE.FAILED_PRECONDITION, "COMPACTION_ABSENT"),
    Path_("Compact", pb.CompactRequest(node=-1), CODE.INVALID_ARGUMENT, "NODE_INVALID", "node"),
    Path_("Compact", pb.CompactRequest(node=3), CODE.NOT_FOUND, "NODE_NOT_FOUND", setup=with_node),
    # Swap.
    Path_("EnableSwap", pb.EnableSwapRequest(), CODE.INVALID_ARGUMENT, "DEVICE_INVALID", "device"),
    Path_(
        "EnableSwap",
        pb.EnableSwapRequest(device=pb.DeviceSelector(path="/etc/x")),
        CODE.INVALID_ARGUMENT,
        "DEVICE_INVALID",
        "device.path",
    ),
    Path_(
        "EnableSwap",
        pb.EnableSwapRequest(device=pb.DeviceSelector(serial="a/b")),
        CODE.INVALID_ARGUMENT,
        "DEVICE_INVALID",
        "device.serial",
    ),
    Path_(
        "EnableSwap",
        pb.EnableSwapRequest(
            device=pb.DeviceSelector(path="/dev/vdb"), discard=pb.DiscardPolicy.ValueType(17)
        ),
        CODE.INVALID_ARGUMENT,
        "ENUM_VALUE_UNKNOWN",
        "discard",
    ),
    Path_(
        "EnableSwap",
        pb.EnableSwapRequest(
            device=pb.DeviceSelector(path="/dev/vdb"), encryption=pb.SwapEncryption.ValueType(9)
        ),
        CODE.INVALID_ARGUMENT,
        "ENUM_VALUE_UNKNOWN",
        "encryption",
    ),
    Path_(
        "EnableSwap",
        pb.EnableSwapRequest(device=pb.DeviceSelector(path="/dev/vdb"), priority=40000),
        CODE.INVALID_ARGUMENT,
        "SWAP_PRIORITY_INVALID",
        "priority",
    ),
    Path_(
        "EnableSwap",
        pb.EnableSwapRequest(device=pb.DeviceSelector(path="/dev/vdb"), label="x" * 17),
        CODE.INVALID_ARGUMENT,
        "SWAP_LABEL_TOO_LONG",
        "label",
    ),
    Path_(
        "EnableSwap",
        pb.EnableSwapRequest(device=pb.DeviceSelector(path="/dev/vdb")),
        CODE.FAILED_PRECONDITION,
        "UDEV_UNAVAILABLE",
    ),
    Path_(
        "DisableSwap", pb.DisableSwapRequest(), CODE.INVALID_ARGUMENT, "DEVICE_INVALID", "device"
    ),
    Path_("ListSwaps", pb.ListSwapsRequest(), CODE.FAILED_PRECONDITION, "SWAP_UNSUPPORTED"),
]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: f"{p.method}-{p.reason}")
async def test_each_refusal_has_its_code_reason_and_field(fake_root: FakeRoot, path: Path_) -> None:
    fake_root.add_cgroup("pod")
    path.setup(fake_root)
    servicer = make_servicer(fake_root)
    context: Any = FakeContext()
    method = getattr(servicer, path.method)
    with pytest.raises(Aborted):
        if path.method == "WatchMemory":
            async for _ in method(path.request, context):
                pass
        else:
            await method(path.request, context)
    refusal = refusal_from(context.code, context.details, context.trailer)
    assert (refusal.code, refusal.reason) == (path.code, path.reason), context.details
    assert refusal.domain == "guestagent"
    assert refusal.message == context.details  # The text stays as it was.
    assert errors.REASONS[path.reason][0] in type_chain(path.code)
    if path.code is CODE.INVALID_ARGUMENT:
        assert refusal.field_violations == ((path.field, context.details),)
    else:
        assert refusal.field_violations == ()


def type_chain(code: grpc.StatusCode) -> set[type[errors.AgentError]]:
    return {cls for cls, mapped in STATUS_BY_ERROR.items() if mapped is code} | (
        {errors.AgentError} if code is CODE.INTERNAL else set()
    )


async def test_a_kernel_value_refusal_names_the_file_and_the_value(fake_root: FakeRoot) -> None:
    fake_root.add_cgroup("pod")
    garbage_current(fake_root)
    context: Any = FakeContext()
    with pytest.raises(Aborted):
        await make_servicer(fake_root).GetMemoryInfo(
            pb.GetMemoryInfoRequest(cgroups=["pod"]), context
        )
    refusal = refusal_from(context.code, context.details, context.trailer)
    assert "pod/memory.current" in refusal.message and "'lots'" in refusal.message
    assert "ValueError" not in refusal.message
    assert refusal.metadata["path"].endswith("pod/memory.current")
    assert refusal.metadata["value"] == "lots\n"


async def test_a_bug_says_so_in_its_reason(
    fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("guestagent.ops.info.read_system", broken)
    context: Any = FakeContext()
    with pytest.raises(Aborted):
        await make_servicer(fake_root).GetMemoryInfo(pb.GetMemoryInfoRequest(), context)
    refusal = refusal_from(context.code, context.details, context.trailer)
    assert (refusal.reason, refusal.metadata) == (BUG_REASON, {"type": "ZeroDivisionError"})


# --- The table against the code and the contract. ---

RAISING_LAYERS = ("agent", "ops", "linux")
# Classes whose instances take their class's default reason (they name no other).
DEFAULTED = {"KernelFormat", "StateFileError", "ToolMissing", "AddressInUse"}


def raised_reasons() -> dict[str, set[str]]:
    """Each reason named at a raise of a domain error in the guest's code: the classes."""
    known = {cls.__name__ for cls, _ in errors.REASONS.values()} | DEFAULTED
    found: dict[str, set[str]] = {}
    missing: list[str] = []
    for layer in RAISING_LAYERS:
        for source in sorted((ROOT / "guestagent" / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(source.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name not in known or name == "AgentError":
                    continue
                reason = node.args[1] if len(node.args) > 1 else None
                if isinstance(reason, ast.Constant) and isinstance(reason.value, str):
                    found.setdefault(reason.value, set()).add(name)
                elif name not in DEFAULTED:
                    missing.append(f"{source.relative_to(ROOT)}:{node.lineno} {name}")
    assert missing == [], "refusals without a reason"
    return found


def test_every_raise_names_a_reason_of_the_table_with_its_class() -> None:
    wrong = []
    for reason, names in raised_reasons().items():
        assert reason in errors.REASONS, f"{reason} is not in errors.REASONS"
        cls = errors.REASONS[reason][0]
        wrong += [
            f"{reason}: raised as {n}, listed as {cls.__name__}" for n in names if n != cls.__name__
        ]
    assert wrong == []


def test_every_reason_of_the_table_is_used() -> None:
    used = set(raised_reasons())
    used |= set(errors.REASON_BY_ERRNO.values())
    used |= {cls.default_reason for cls in STATUS_BY_ERROR}
    used |= {"AGENT_ERROR", "STATE_UNUSABLE", "TOOL_MISSING", "ADDRESS_IN_USE"}
    assert set(errors.REASONS) - used == set()


def test_the_contract_lists_every_reason_beside_its_code() -> None:
    text = (ROOT / "docs" / "contract.md").read_text()
    rows = dict(re.findall(r"^\| `([A-Z0-9_]+)` \| `?([A-Z_]+)`? \|", text, re.MULTILINE))
    expected = {
        reason: STATUS_BY_ERROR.get(cls, CODE.INTERNAL).name
        for reason, (cls, _) in errors.REASONS.items()
    }
    expected[BUG_REASON] = "INTERNAL"
    assert rows == expected


def code_rows(text: str) -> list[str]:
    """The codes of a `| code | when |` table: a code, then prose."""
    return re.findall(r"^\| `([A-Z_]+)` \| [a-z]", text, re.MULTILINE)


def test_the_contract_lists_the_codes_of_the_table_and_the_readme_points_there() -> None:
    """The README is short: it sends a reader to the contract's table of codes."""
    contract = code_rows((ROOT / "docs" / "contract.md").read_text())
    assert set(contract) == {code.name for code in STATUS_BY_ERROR.values()}
    assert "docs/contract.md" in (ROOT / "README.md").read_text()
