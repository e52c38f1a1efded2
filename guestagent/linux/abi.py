"""Kernel constants, each defined once: the rest of the agent asks here, not the kernel."""

from __future__ import annotations

import os

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# Free page reporting and THP work on pageblocks: order 9, 2 MiB with x86-64's 4 KiB pages.
HUGE_ORDER = 9
# LONG_MAX: the kernel's largest limit (shown as "max"), and the OCI spec's int64 bound.
LONG_MAX = 2**63 - 1

# swapon(2) flags, from <linux/swap.h>.
SWAP_FLAG_PREFER = 0x8000
SWAP_FLAG_PRIO_MASK = 0x7FFF
SWAP_FLAG_DISCARD = 0x10000
SWAP_FLAG_DISCARD_ONCE = 0x20000
SWAP_FLAG_DISCARD_PAGES = 0x40000
