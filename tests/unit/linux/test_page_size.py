"""Every figure that follows from the page size, for the three an arm64 kernel can run
(Debian's and Apple's 4 KiB, 16 KiB, RHEL-family 64 KiB), fed what each kernel would print."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from guestagent.linux.abi import huge_order, page_shift, reporting_order
from guestagent.linux.blockdev import blank_check_plan, probe_signatures
from guestagent.linux.cgroup.memory import kernel_pages, same_limit
from guestagent.linux.memblocks import block_size_bytes
from guestagent.linux.mm import parse_buddyinfo
from guestagent.linux.swaps import parse_swap_header
from guestagent.ops.compaction import free_bytes_at_or_above
from guestagent.ops.workingset.compaction_trigger import compaction_decision
from guestagent.ops.workingset.policy import ControllerState, ReclaimPolicy, Sample, decide
from guestagent.sizes import MIB
from tests.fakes.root import FakeRoot


@dataclass(frozen=True)
class Kernel:
    """What a 6.1 arm64 kernel built for one page size prints."""

    page_size: int  # getconf PAGESIZE
    shift: int
    hpage_pmd_size: int  # /sys/kernel/mm/transparent_hugepage/hpage_pmd_size
    reporting_block: int  # the smallest block virtio-balloon reports
    buddy_orders: int  # /proc/buddyinfo columns: MAX_ORDER (ARCH_FORCE_MAX_ORDER)
    block_size_bytes: str  # /sys/devices/system/memory/block_size_bytes (SECTION_SIZE_BITS)
    memory_max_of_100000: int  # memory.max read back after writing 100000


KERNELS = [
    Kernel(4096, 12, 2 * MIB, 2 * MIB, 11, "8000000", 98304),
    Kernel(16384, 14, 32 * MIB, 32 * MIB, 12, "8000000", 98304),
    Kernel(65536, 16, 512 * MIB, 2 * MIB, 14, "20000000", 65536),
]
BY_SIZE = pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: f"{k.page_size // 1024}k")


@BY_SIZE
def test_orders_follow_the_page_size(kernel: Kernel) -> None:
    assert page_shift(kernel.page_size) == kernel.shift
    assert kernel.page_size << huge_order(kernel.page_size) == kernel.hpage_pmd_size
    assert kernel.page_size << reporting_order(kernel.page_size) == kernel.reporting_block


@pytest.mark.parametrize("size", [0, 2048, 4095, 12288, 1 << 40 | 1])
def test_a_page_size_no_kernel_runs_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        page_shift(size)


@BY_SIZE
def test_buddyinfo_and_huge_blocks(kernel: Kernel) -> None:
    # One free block of each order in one zone: the huge ones are those at or above the PMD.
    counts = " ".join("1" for _ in range(kernel.buddy_orders))
    blocks = parse_buddyinfo(f"Node 0, zone   Normal {counts}\n")
    assert len(blocks) == kernel.buddy_orders
    order = huge_order(kernel.page_size)
    huge = sum(kernel.page_size << o for o in range(order, kernel.buddy_orders))
    assert free_bytes_at_or_above(blocks, order, kernel.page_size) == huge
    assert huge >= kernel.hpage_pmd_size  # The kernel's largest order holds a THP.


@BY_SIZE
def test_compaction_counts_what_reporting_cannot_take(kernel: Kernel) -> None:
    below = reporting_order(kernel.page_size)
    small = [0] * kernel.buddy_orders
    # 64 MiB in single pages, nothing at the reporting order or above.
    small[0] = 64 * MIB // kernel.page_size
    run, why = compaction_decision(tuple(small), kernel.page_size, 0, 2000, None)
    assert run, why
    assert f"64 MiB of 64 MiB free is in blocks under {kernel.reporting_block // MIB} MiB" in why
    reportable = [0] * kernel.buddy_orders
    reportable[below] = 64 * MIB // kernel.reporting_block
    run, why = compaction_decision(tuple(reportable), kernel.page_size, 0, 2000, None)
    assert not run and why.startswith("not worth it: 0 MiB of 64 MiB"), why


@BY_SIZE
def test_swap_header_sits_at_the_end_of_the_first_page(kernel: Kernel) -> None:
    # What mkswap writes: the signature in the last 10 bytes of the first page, the UUID
    # and label at fixed offsets in struct swap_header_v1_2.
    head = bytearray(128 * 1024)
    head[1036:1052] = bytes(range(16))
    head[1052:1057] = b"swap0"
    head[kernel.page_size - 10 : kernel.page_size] = b"SWAPSPACE2"
    header = parse_swap_header(bytes(head), kernel.page_size)
    assert header is not None and header.label == "swap0"
    assert probe_signatures(bytes(head), kernel.page_size) == ["swap"]
    for other in KERNELS:
        if other.page_size != kernel.page_size:
            assert parse_swap_header(bytes(head), other.page_size) is None


@BY_SIZE
def test_blank_check_samples_whole_pages(kernel: Kernel) -> None:
    plan = blank_check_plan(8 << 30, sample=kernel.page_size)
    middle = plan[1:-1]
    assert len(middle) == 1024
    assert all(o % kernel.page_size == 0 and n == kernel.page_size for o, n in middle)


@BY_SIZE
def test_memory_max_is_kept_in_whole_pages(kernel: Kernel) -> None:
    assert kernel_pages("100000", kernel.page_size) * kernel.page_size == (
        kernel.memory_max_of_100000
    )
    assert same_limit("100000", str(kernel.memory_max_of_100000), kernel.page_size)
    assert not same_limit("100000", str(kernel.memory_max_of_100000 - 1), kernel.page_size)


@BY_SIZE
def test_memory_block_size_is_the_kernels(kernel: Kernel, fake_root: FakeRoot) -> None:
    fake_root.write("sys/devices/system/memory/block_size_bytes", kernel.block_size_bytes + "\n")
    assert block_size_bytes(fake_root.fs) == int(kernel.block_size_bytes, 16)


@BY_SIZE
def test_reclaim_steps_are_whole_pages(kernel: Kernel) -> None:
    sample = Sample(stall_us=0, refault_bytes=0, current=300 * MIB + 1, protected=0)
    step = decide(sample, ReclaimPolicy(), ControllerState(), kernel.page_size).step_bytes
    assert step > 0 and step % kernel.page_size == 0
