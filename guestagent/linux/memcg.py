"""The memory controller's limit files, and how the kernel stores what is written to them."""

from __future__ import annotations

from guestagent.linux.abi import LONG_MAX

MEMORY_MAX = "memory.max"
SWAP_MAX = "memory.swap.max"
MEMORY_LOW = "memory.low"
LIMIT_FILES = (MEMORY_MAX, SWAP_MAX, MEMORY_LOW)


def kernel_pages(text: str, page_size: int) -> int:
    """What the kernel stores for a limit's text: whole pages, "max" as its largest count
    (LONG_MAX / PAGE_SIZE; any larger number written is stored as that)."""
    largest = LONG_MAX // page_size
    value = text.strip()
    return largest if value == "max" else min(int(value) // page_size, largest)


def same_limit(a: str, b: str, page_size: int) -> bool:
    """True when the kernel holds the same limit for both texts (4097 and 4096 are one page)."""
    try:
        return kernel_pages(a, page_size) == kernel_pages(b, page_size)
    except ValueError:
        return a.strip() == b.strip()
