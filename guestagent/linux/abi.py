"""Kernel constants, each defined once: the rest of the agent asks here, not the kernel."""

from __future__ import annotations

import os


def page_shift(page_size: int) -> int:
    """log2 of a page size the kernel can run: 4 KiB on x86-64, 4, 16 or 64 KiB on arm64."""
    if page_size < 4096 or page_size & (page_size - 1):
        raise ValueError(f"page size {page_size} is not a power of two of at least 4096")
    return page_size.bit_length() - 1


def huge_order(page_size: int) -> int:
    """The order of a PMD-mapped block (a THP, a pageblock): a page-table page holds
    page_size / 8 entries, so 2 MiB with 4 KiB pages, 32 MiB with 16 KiB, 512 MiB with 64 KiB."""
    return page_shift(page_size) - 3


def reporting_order(page_size: int) -> int:
    """The smallest free block virtio-balloon's free page reporting hands to the host: a
    pageblock, except with 64 KiB pages, where the driver asks for order 5 (2 MiB) rather than
    512 MiB (drivers/virtio/virtio_balloon.c)."""
    return 5 if page_size == 65536 else huge_order(page_size)


# The running kernel's page size, read once; everything below follows from it.
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
HUGE_ORDER = huge_order(PAGE_SIZE)
# LONG_MAX: the kernel's largest limit (shown as "max"), and the OCI spec's int64 bound.
LONG_MAX = 2**63 - 1

# swapon(2) flags, from <linux/swap.h>.
SWAP_FLAG_PREFER = 0x8000
SWAP_FLAG_PRIO_MASK = 0x7FFF
SWAP_FLAG_DISCARD = 0x10000
SWAP_FLAG_DISCARD_ONCE = 0x20000
SWAP_FLAG_DISCARD_PAGES = 0x40000
