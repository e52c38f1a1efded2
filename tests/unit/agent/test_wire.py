"""wire.py: every request decodes to domain values (or a clear refusal), every result encodes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from guestagent.agent import encoding, wire
from guestagent.agent.watch_stream import WatchReason, WatchUpdate
from guestagent.errors import InvalidArgument
from guestagent.linux.cgroup.name import CgroupName, cgroup_name
from guestagent.linux.confidential import Confidential
from guestagent.linux.device_selector import DeviceSelector
from guestagent.linux.watch import PressureTriggerSpec
from guestagent.ops.compaction import CompactResult
from guestagent.ops.info import InfoSpec, Reporter
from guestagent.ops.limits import MemorySpec, SetLimitsSpec
from guestagent.ops.reclaim import ReclaimResult, ReclaimSpec
from guestagent.ops.swap_area import (
    DEFAULT_LABEL,
    DiscardPolicy,
    EnableSwapSpec,
    SwapArea,
    SwapEncryption,
)
from guestagent.ops.workingset.policy import Mode, ReclaimPolicy
from guestagent.ops.workingset.status import (
    ReclaimPolicyRequest,
    TargetStatus,
    WorkloadReclaimRequest,
)
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.root import FakeRoot


def test_memory_info_reclaim_status_and_overhead_requests_name_cgroups() -> None:
    assert wire.cgroups_from_pb(pb.GetMemoryInfoRequest(cgroups=["a", "b/c"])) == ("a", "b/c")
    assert wire.cgroups_from_pb(pb.GetReclaimStatusRequest(cgroups=["a"])) == ("a",)
    assert wire.cgroups_from_pb(pb.GetReclaimStatusRequest()) == ()
    assert wire.workloads_from_pb(pb.GetGuestOverheadRequest(workload_cgroups=["w"])) == ("w",)


# Every request that names cgroups: the names its decoder gives the operation for one name.
def one_cgroups_policy(request: pb.SetReclaimPolicyRequest) -> str:
    decoded = wire.reclaim_policy_request_from_pb(request)
    assert isinstance(decoded, ReclaimPolicyRequest)
    return decoded.cgroup


DECODED_NAMES: dict[str, Callable[[str], tuple[str, ...]]] = {
    "SetMemoryLimits": lambda name: (
        wire.set_limits_spec_from_pb(
            pb.SetMemoryLimitsRequest(cgroup=name, memory=pb.LinuxMemory(limit=1), create=True)
        ).cgroup,
    ),
    "Reclaim": lambda name: (
        wire.reclaim_spec_from_pb(pb.ReclaimRequest(cgroup=name, bytes=1)).cgroup,
    ),
    "SetReclaimPolicy": lambda name: (one_cgroups_policy(pb.SetReclaimPolicyRequest(cgroup=name)),),
    "GetMemoryInfo": lambda name: (
        wire.memory_info_from_pb(pb.GetMemoryInfoRequest(cgroups=[name])).cgroups
    ),
    "WatchMemory": lambda name: (
        wire.watch_spec_from_pb(pb.WatchMemoryRequest(cgroups=[name])).cgroups
    ),
    "GetReclaimStatus": lambda name: wire.cgroups_from_pb(
        pb.GetReclaimStatusRequest(cgroups=[name])
    ),
    "GetGuestOverhead": lambda name: wire.workloads_from_pb(
        pb.GetGuestOverheadRequest(workload_cgroups=[name])
    ),
}


@pytest.mark.parametrize("method", DECODED_NAMES)
@pytest.mark.parametrize("name", ["..", "pod/../..", "/sys/fs/cgroup/pod", "pod/./ctr", ""])
def test_a_bad_cgroup_name_is_refused_where_the_request_is_decoded(method: str, name: str) -> None:
    """The one check of a name: the operations are given it checked, and check it no more."""
    with pytest.raises(InvalidArgument) as refused:
        DECODED_NAMES[method](name)
    assert refused.value.reason == "CGROUP_PATH_INVALID"


@pytest.mark.parametrize("method", DECODED_NAMES)
def test_a_cgroup_name_is_decoded_to_its_checked_one_form(method: str) -> None:
    (name,) = DECODED_NAMES[method]("pod//ctr/")
    assert (type(name), name) == (CgroupName, "pod/ctr")


def test_watch_request_defaults() -> None:
    spec = wire.watch_spec_from_pb(pb.WatchMemoryRequest(cgroups=["pod"]))
    assert spec.cgroups == ("pod",)
    assert spec.interval_s == 1.0
    assert spec.trigger == PressureTriggerSpec()


def test_watch_request_with_interval_and_trigger() -> None:
    spec = wire.watch_spec_from_pb(
        pb.WatchMemoryRequest(
            interval_ms=250,
            pressure_trigger=pb.PressureTrigger(stall_us=50_000, window_us=500_000, full=True),
        )
    )
    assert spec.interval_s == 0.25
    assert spec.trigger == PressureTriggerSpec(50_000, 500_000, True)


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (pb.WatchMemoryRequest(interval_ms=99), "99 ms is below the minimum 100 ms"),
        (
            pb.WatchMemoryRequest(pressure_trigger=pb.PressureTrigger(stall_us=1, window_us=10)),
            "window 10 us",
        ),
    ],
)
def test_watch_request_refusals(request_: pb.WatchMemoryRequest, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        wire.watch_spec_from_pb(request_)


def test_enable_swap_request() -> None:
    spec = wire.enable_swap_spec_from_pb(
        pb.EnableSwapRequest(
            device=pb.DeviceSelector(serial="swap0"),
            priority=5,
            discard=pb.DISCARD_PAGES,
            wait_ms=300,
            force=True,
        )
    )
    assert spec == EnableSwapSpec(
        DeviceSelector(serial="swap0"), 5, DiscardPolicy.PAGES, 300, True, DEFAULT_LABEL
    )
    unset = wire.enable_swap_spec_from_pb(
        pb.EnableSwapRequest(device=pb.DeviceSelector(path="/dev/vdb"))
    )
    assert unset.priority is None and unset.discard is DiscardPolicy.BOTH


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (pb.EnableSwapRequest(), "no device given"),
        (pb.EnableSwapRequest(device=pb.DeviceSelector(path="/dev/vdb"), discard=9), "9"),  # type: ignore[arg-type]
        (pb.EnableSwapRequest(device=pb.DeviceSelector(path="/etc/passwd")), "not under /dev"),
    ],
)
def test_enable_swap_refusals(request_: pb.EnableSwapRequest, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        wire.enable_swap_spec_from_pb(request_)


def test_disable_swap_request() -> None:
    request = pb.DisableSwapRequest(device=pb.DeviceSelector(path="/dev/vdb"))
    assert wire.disable_swap_from_pb(request) == DeviceSelector(path="/dev/vdb")
    with pytest.raises(InvalidArgument, match="no device given"):
        wire.disable_swap_from_pb(pb.DisableSwapRequest())


def test_set_limits_request() -> None:
    spec = wire.set_limits_spec_from_pb(
        pb.SetMemoryLimitsRequest(
            cgroup="pod/ctr", memory=pb.LinuxMemory(limit=64 << 20, swap=-1), create=True
        )
    )
    assert spec == SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec(64 << 20, -1, None), True)


def test_set_limits_refuses_every_v1_knob_by_name() -> None:
    memory = pb.LinuxMemory(limit=1, kernel=2, kernel_tcp=3, swappiness=4, disable_oom_killer=True)
    with pytest.raises(InvalidArgument) as raised:
        wire.set_limits_spec_from_pb(pb.SetMemoryLimitsRequest(cgroup="x", memory=memory))
    assert "kernel=2, kernel_tcp=3, swappiness=4, disable_oom_killer=True" in str(raised.value)


def test_compact_and_reclaim_requests() -> None:
    assert wire.compact_node_from_pb(pb.CompactRequest()) is None
    assert wire.compact_node_from_pb(pb.CompactRequest(node=0)) == 0
    assert wire.reclaim_spec_from_pb(
        pb.ReclaimRequest(cgroup="pod", bytes=1 << 20, drop_caches=1)
    ) == ReclaimSpec(cgroup_name("pod"), 1 << 20, 1)


def test_requests_without_fields() -> None:
    assert wire.no_arguments(pb.ListSwapsRequest()) is None  # type: ignore[func-returns-value]
    assert wire.no_arguments(pb.OnlineMemoryRequest()) is None  # type: ignore[func-returns-value]


def test_compact_result_carries_the_domain_figures() -> None:
    result = CompactResult(
        node=None,
        duration_s=0.25,
        free_blocks_before=(3, 1),
        free_blocks_after=(0, 2),
        counters={"compact_success": 4},
        huge_block_bytes=2 << 20,
        free_huge_bytes_before=10 << 20,
        free_huge_bytes_after=40 << 20,
        shared=True,
    )
    message = wire.compact_result_pb(result)
    assert message.duration_us == 250_000
    assert list(message.free_blocks_after) == [0, 2]
    assert message.free_huge_bytes_before == 10 << 20
    assert message.free_huge_bytes_after == 40 << 20
    assert message.huge_block_bytes == 2 << 20
    assert dict(message.counters) == {"compact_success": 4}
    assert message.shared


def test_reclaim_result() -> None:
    message = wire.reclaim_result_pb(ReclaimResult("pod", 9 << 20, 8 << 20, False))
    assert (message.current_before_bytes, message.current_after_bytes) == (9 << 20, 8 << 20)
    assert not message.complete


def test_reclaim_status_says_which_way_the_last_step_went_and_what_each_way_took() -> None:
    status = TargetStatus(
        "pod",
        True,
        ReclaimPolicy(cold_after_ms=30_000),
        Mode.PROBING,
        "",
        9 << 20,
        4 << 20,
        0,
        0,
        3,
        0,
        0,
        last_step="evict_cold",
        last_step_us=812_000,
        evicted_cold_total=5 << 20,
        probed_total=4 << 20,
    )
    message = wire.reclaim_target_pb(status)
    assert (message.last_step, message.last_step_us) == ("evict_cold", 812_000)
    assert (message.evicted_cold_total_bytes, message.probed_total_bytes) == (5 << 20, 4 << 20)
    assert message.policy.cold_after_ms == 30_000


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (WatchReason.INITIAL, pb.WATCH_REASON_INITIAL),
        (WatchReason.INTERVAL, pb.WATCH_REASON_INTERVAL),
        (WatchReason.MEMORY_EVENTS, pb.WATCH_REASON_MEMORY_EVENTS),
        (WatchReason.PRESSURE, pb.WATCH_REASON_PRESSURE),
    ],
)
def test_watch_update_reason(
    fake_root: FakeRoot, reason: WatchReason, expected: pb.WatchReason.ValueType
) -> None:
    fake_root.add_cgroup("pod")
    update = WatchUpdate(
        Reporter(fake_root.fs).report(InfoSpec((cgroup_name("pod"),))), reason, ("pod",)
    )
    message = wire.watch_update_pb(update)
    assert message.reason == expected
    assert list(message.changed_cgroups) == ["pod"]
    assert message.cgroups[0].path == "pod"


def swap_area(rotational: bool | None) -> SwapArea:
    return SwapArea(
        "/dev/vdb", 1 << 30, 0, 10, DiscardPolicy.BOTH, True, rotational, "u", "guestagent-swap"
    )


@pytest.mark.parametrize("rotational", [False, True, None])
def test_rotational_is_sent_only_when_known(rotational: bool | None) -> None:
    message = wire.swap_area_pb(swap_area(rotational))
    assert message.HasField("rotational") == (rotational is not None)
    if rotational is not None:
        assert message.rotational is rotational


@pytest.mark.parametrize(
    ("value", "encryption"),
    [
        (pb.SWAP_ENCRYPTION_DEFAULT, SwapEncryption.DEFAULT),
        (pb.SWAP_ENCRYPTION_NONE, SwapEncryption.NONE),
        (pb.SWAP_ENCRYPTION_EPHEMERAL, SwapEncryption.EPHEMERAL),
    ],
)
def test_swap_encryption_request(value: int, encryption: SwapEncryption) -> None:
    request = pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0"), encryption=value)  # type: ignore[arg-type]
    assert wire.enable_swap_spec_from_pb(request).encryption is encryption


def test_an_unknown_swap_encryption_is_refused() -> None:
    request = pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0"), encryption=7)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="swap encryption 7"):
        wire.enable_swap_spec_from_pb(request)


def test_an_encrypted_area_names_its_mapping_and_disk() -> None:
    area = SwapArea(
        "/dev/dm-0",
        1 << 30,
        0,
        -2,
        DiscardPolicy.BOTH,
        True,
        False,
        "u",
        "guestagent-swap",
        encrypted=True,
        mapping="/dev/mapper/guestagent-swap-vdb",
        backing_device="/dev/vdb",
    )
    message = wire.swap_area_pb(area)
    assert message.encrypted and message.device == "/dev/dm-0"
    assert (message.mapping, message.backing_device) == (
        "/dev/mapper/guestagent-swap-vdb",
        "/dev/vdb",
    )


@pytest.mark.parametrize("pair", encoding.PAIRS.values(), ids=lambda p: p.domain.__name__)
def test_every_field_is_carried_or_declared(pair: encoding.Pair) -> None:
    """A field added to a message or a domain type alone fails here: it must reach the
    other side by the naming convention or be declared (by hand, renamed, off the wire)."""
    assert encoding.mismatches(pair) == []


def test_a_field_on_one_side_only_is_caught() -> None:
    """The check above, planted: a domain field the message lacks, a message field the
    domain lacks, and a declaration naming a field that is gone."""

    @dataclasses.dataclass(frozen=True)
    class Extra:
        feature: str
        reason: str
        since: int  # Not in pb.Absent.

    @dataclasses.dataclass(frozen=True)
    class Short:
        feature: str  # pb.Absent has reason too.

    assert encoding.mismatches(encoding.Pair(Extra, pb.Absent)) == [
        "Extra.since reaches no field of Absent"
    ]
    assert encoding.mismatches(encoding.Pair(Short, pb.Absent)) == [
        "Absent.reason takes no field of Short"
    ]
    assert encoding.mismatches(encoding.Pair(Short, pb.Absent, renamed={"reason": "why"})) == [
        "Short has no field why, which the declaration names"
    ]


def test_every_answer_type_is_declared() -> None:
    """Each message an RPC answers with, and each one nested in those, has a declaration
    (or is built by hand in wire.py: the ones listed)."""
    by_hand = {
        "ListSwapsResponse",
        "Limit",
        "MemoryStall",
        "VirtioMemRegion",
        "Feature",
        "SwiotlbSize",
    }
    declared = {p.message.DESCRIPTOR.name for p in encoding.PAIRS.values()}
    answers = [m.output_type for m in pb.DESCRIPTOR.services_by_name["MemoryAgent"].methods]
    seen, todo = set(), list(answers)
    while todo:
        message = todo.pop()
        if message.name in seen:
            continue
        seen.add(message.name)
        todo.extend(
            f.message_type
            for f in message.fields
            if f.message_type is not None and not f.message_type.GetOptions().map_entry
        )
    assert sorted(seen - declared - by_hand) == []


def test_the_stream_carries_what_the_unary_call_carries(fake_root: FakeRoot) -> None:
    fake_root.add_cgroup("pod")
    reporter = Reporter(fake_root.fs, confidential=Confidential("sev-snp", "sev_guest node"))
    answer = dataclasses.replace(
        reporter.report(InfoSpec((cgroup_name("pod"),))),
        state_unavailable="/run/guestagent is read-only",
    )
    unary = wire.report_pb(answer)
    streamed = wire.watch_update_pb(WatchUpdate(answer, WatchReason.INTERVAL))
    assert streamed.confidential.platform == "sev-snp"
    assert streamed.state_unavailable == "/run/guestagent is read-only"
    streamed.ClearField("reason")
    assert streamed == unary


def test_the_workloads_policy_names_no_cgroup() -> None:
    decoded = wire.reclaim_policy_request_from_pb(
        pb.SetReclaimPolicyRequest(workloads=True, enabled=True)
    )
    assert decoded == WorkloadReclaimRequest(True)
    with pytest.raises(InvalidArgument, match="cgroup 'pod' and workloads both") as refused:
        wire.reclaim_policy_request_from_pb(
            pb.SetReclaimPolicyRequest(cgroup="pod", workloads=True)
        )
    assert refused.value.field == "cgroup"
