"""`guestctl info`: the hotplug section, absent kernel features, swap areas; `overhead`."""

import pytest

from guestagent.agent.wire import hotplug_pb, memory_info_pb, overhead_pb, report_pb
from guestagent.host.display import (
    memory_info_text,
    overhead_text,
    reclaim_target_text,
    swap_area_text,
)
from guestagent.linux.features import MGLRU, PSI, Absent
from guestagent.linux.memblocks import HotplugReport, RegionBlocks, VirtioMemRegion
from guestagent.linux.meminfo import MemoryReport, SystemMemory
from guestagent.linux.swiotlb import DEBUGFS_SOURCE, SWIOTLB, Swiotlb
from guestagent.ops.info import NOT_CONFIDENTIAL, Report
from guestagent.ops.overhead import GuestOverhead
from guestagent.ops.workingset.policy import Mode, ReclaimPolicy
from guestagent.ops.workingset.status import TargetStatus
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb

REPORT = HotplugReport(
    block_size=128 * MIB,
    movable_blocks=4,
    normal_blocks=5,
    offline_blocks=1,
    regions=(RegionBlocks(VirtioMemRegion("virtio4", 1 << 32, 3 << 30), 4, 1, 0, 640 * MIB),),
)


def test_info_shows_zones_and_virtio_mem_devices() -> None:
    system = SystemMemory(1 << 30, 0, 0, 0, 0, 0, 0, 0)
    info = memory_info_pb(MemoryReport(0, system, None, (), hotplug=REPORT))
    text = memory_info_text(info)
    assert (
        "hotplug  blocks of 128.0 MiB: movable 4 (512.0 MiB, unpluggable)  normal 5  offline 1"
        in text
    )
    assert (
        "  virtio4 at 0x100000000: plugged 640.0 MiB of 3,072.0 MiB  blocks movable 4  "
        "normal 1  offline 0" in text
    )


def test_no_hotplug_section_without_memory_hotplug() -> None:
    system = SystemMemory(1 << 30, 0, 0, 0, 0, 0, 0, 0)
    info = memory_info_pb(MemoryReport(0, system, None, ()))
    assert not info.HasField("hotplug") and "hotplug" not in memory_info_text(info)
    assert hotplug_pb(REPORT).virtio_mem[0].plugged_bytes == 640 * MIB


@pytest.mark.parametrize(("rotational", "text"), [(False, "0"), (True, "1"), (None, "unknown")])
def test_swap_area_shows_rotational_when_known(rotational: bool | None, text: str) -> None:
    message = pb.SwapArea(device="/dev/vdb", size_bytes=1 << 30, priority=10, uuid="u")
    if rotational is not None:
        message.rotational = rotational
    assert f"rotational {text} " in swap_area_text(message)


def test_absent_features_are_shown_with_their_reasons() -> None:
    system = SystemMemory(1 << 30, 0, 0, 0, 0, 0, 0, 0)
    no_psi = Absent(PSI, "the kernel was booted with psi=0; boot with psi=1 instead")
    off = Absent(MGLRU, "the multi-gen LRU is off (lru_gen/enabled 0x0000)")
    status = TargetStatus(
        "pod", True, ReclaimPolicy(), Mode.PROBING, "", 0, 0, 0, 0, 1, 0, 0, absent=(off,)
    )
    report = MemoryReport(0, system, None, (), absent=(no_psi,))
    info = report_pb(Report(report, NOT_CONFIDENTIAL, reclaim=(status,)))
    text = memory_info_text(info)
    assert "absent   psi: the kernel was booted with psi=0" in text
    assert "runs on psi_stall, refaults, reclaim_yield" in text
    assert "without mglru: the multi-gen LRU is off" in text
    assert list(info.reclaim[0].signals) == ["psi_stall", "refaults", "reclaim_yield"]


def test_info_shows_the_confidential_platform_and_why() -> None:
    info = memory_info_pb(MemoryReport(0, SystemMemory(1 << 30, 0, 0, 0, 0, 0, 0, 0), None, ()))
    info.confidential.platform = "sev-snp"
    info.confidential.evidence = "/sys/devices/platform/sev-guest"
    assert "guest    confidential sev-snp (/sys/devices/platform/sev-guest)" in memory_info_text(
        info
    )


def test_an_encrypted_area_shows_its_mapping() -> None:
    message = pb.SwapArea(
        device="/dev/dm-0",
        encrypted=True,
        mapping="/dev/mapper/guestagent-swap-vdb",
        backing_device="/dev/vdb",
    )
    assert "encrypted: /dev/mapper/guestagent-swap-vdb over /dev/vdb" in swap_area_text(message)


def test_a_cgroup_gets_one_idle_line_and_the_guest_its_giveback() -> None:
    system = SystemMemory(1 << 30, 0, 0, 0, 0, 0, 0, 0)
    info = memory_info_pb(MemoryReport(0, system, None, ()))
    pod = info.cgroups.add(path="pod")
    pod.idle.bins.add(idle_at_least_ms=0, anon_bytes=100 * MIB, file_bytes=MIB)
    pod.idle.bins.add(idle_at_least_ms=300_000, anon_bytes=400 * MIB)
    pod.giveback.cold.CopyFrom(pb.Figure(bytes=400 * MIB, reason="r"))
    info.giveback.safe_balloon_target.CopyFrom(pb.Figure(bytes=300 * MIB, reason="why"))
    text = memory_info_text(info)
    assert "  idle MiB by idle age: >=0s 101(100a)  >=5m 400(400a)  cold 400.0 MiB" in text
    assert "giveback safe_balloon_target 300.0 MiB: why" in text


@pytest.mark.parametrize(
    ("swiotlb", "shown"),
    [
        (Swiotlb(64 * MIB, DEBUGFS_SOURCE), "of which swiotlb 64.0 MiB (from debugfs)"),
        (
            Absent(SWIOTLB, "debugfs has no swiotlb directory; the boot log is empty"),
            "of which swiotlb unknown: debugfs has no swiotlb directory; the boot log is empty",
        ),
    ],
)
def test_overhead_shows_the_swiotlb(swiotlb: Swiotlb | Absent, shown: str) -> None:
    overhead = GuestOverhead(512 * MIB, 400 * MIB, 112 * MIB, 60 * MIB, 40 * MIB, 0, swiotlb)
    message = overhead_pb(overhead)
    assert message.WhichOneof("swiotlb") == (
        "swiotlb_absent" if isinstance(swiotlb, Absent) else "swiotlb_size"
    )
    text = overhead_text(message)
    assert "kernel reserved 112.0 MiB, " + shown in text


def test_overhead_from_an_older_agent_says_it_has_no_swiotlb() -> None:
    assert "swiotlb not reported (an older agent)" in overhead_text(pb.GuestOverhead())


def test_delay_accountings_stall_is_shown_with_its_source() -> None:
    system = SystemMemory(1 << 30, 0, 0, 0, 0, 0, 0, 0)
    info = memory_info_pb(MemoryReport(0, system, None, (), delay_stall_us=2_500_000))
    text = memory_info_text(info)
    assert "pressure (no PSI)" in text
    assert "stall    2.500 s in all (delayacct_stall, summed over tasks)" in text


def test_the_reclaim_line_says_which_way_the_last_step_went_and_each_ways_total() -> None:
    status = pb.ReclaimTargetStatus(
        cgroup="pod",
        reclaimed_total_bytes=300 * MIB,
        reclaimed_last_bytes=40 * MIB,
        evicted_cold_total_bytes=290 * MIB,
        probed_total_bytes=10 * MIB,
        last_step="evict_cold",
        last_step_us=987_000,
        policy=pb.ReclaimPolicy(cold_after_ms=60_000),
    )
    text = reclaim_target_text(status)
    assert "reclaimed 300.0 MiB in total (evicted cold 290.0 MiB, probed 10.0 MiB)" in text
    assert "40.0 MiB last step (evict_cold, 987 ms)" in text
    assert "cold after 60 s" in text
    assert "last step;" in reclaim_target_text(pb.ReclaimTargetStatus(cgroup="pod"))
