"""How long one eviction command into the multi-gen LRU's debugfs file takes in this guest
(under TCG here), by size and kind: the write the reclaimer cannot cut short, so its chunk
size (policy.EVICT_CHUNK_BYTES) bounds how long a step runs past what should stop it.

A workload in its own cgroup touches anonymous memory and reads a file once; once the cgroup's
oldest generation is evictable (two below the youngest), a script in the guest reads the
generations and writes `- memcg node seq swappiness pages` for the oldest, timing each write
and reading the cgroup's pgsteal around it. Needs the multi-gen LRU, debugfs and an active
swap area."""

from __future__ import annotations

import json
import statistics
from typing import Any

from guestagent.linux.lru_gen import parse_lru_gen
from guestagent.sizes import MIB
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import wait_until
from tests.workloads.reclaim import fill_data_disk, start_workload, stop_workload

CGROUP = "evict"
ANON_MIB = FILE_MIB = 96
# Write sizes in pages (1, 4 and 16 MiB), each REPEATS times, file pages then anon.
SIZES = (256, 1024, 4096)
REPEATS = 3
LRU_GEN = "/sys/kernel/debug/lru_gen"
MOUNTED = "{ mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug; }"
AGENT_PYTHON = "/opt/guestagent/bin/python3"

# Run by the agent's own interpreter, with its lru_gen module: read and write in one process,
# since an aging between a read and a write over the host's round trip can fold the
# generation named.
TIMER = r"""
import json, sys, time
from guestagent.linux.lru_gen import Eviction, eviction_command, parse_lru_gen
path, cgroup = "/sys/kernel/debug/lru_gen", "/" + sys.argv[1]
sizes, repeats = [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])


def stolen():
    with open(f"/sys/fs/cgroup{cgroup}/memory.stat") as stat:
        return int(dict(line.split() for line in stat)["pgsteal"])


for anon in (False, True):
    for pages in sizes:
        for _ in range(repeats):
            with open(path) as f:
                (lruvec,) = [v for v in parse_lru_gen(f.read()) if v.path == cgroup]
            command = eviction_command(
                Eviction(lruvec.memcg_id, lruvec.node, lruvec.generations[0].seq, anon, pages)
            )
            before, started = stolen(), time.monotonic()
            with open(path, "w") as f:
                f.write(command)
            ms = round((time.monotonic() - started) * 1000, 1)
            print(json.dumps({"anon": anon, "pages": pages, "ms": ms, "stolen": stolen() - before}))
"""


def evictable_pages(vm: GuestVM) -> tuple[int, int]:
    """(anon, file) pages in the cgroup's generations the kernel would evict now."""
    text = vm.exec(f"{MOUNTED} && cat {LRU_GEN}").stdout
    (lruvec,) = [v for v in parse_lru_gen(text) if v.path == f"/{CGROUP}"]
    gens = [g for g in lruvec.generations if lruvec.evictable(g.seq)]
    return sum(g.anon_pages for g in gens), sum(g.file_pages for g in gens)


def eviction_write_times(vm: GuestVM) -> dict[str, Any]:
    """Median ms per write and MiB/s by kind and size, with each write's time and take."""
    vm.exec("echo 3 > /proc/sys/vm/drop_caches")  # So the file is charged to this cgroup.
    device = fill_data_disk(vm, FILE_MIB)
    out = start_workload(vm, CGROUP, ANON_MIB, 1, device, FILE_MIB)
    need = sum(SIZES) * REPEATS
    wait_until(
        lambda: min(evictable_pages(vm)) >= need, 180, "the set to reach an evictable generation"
    )
    vm.exec(["sh", "-c", "cat > /run/eviction-timer.py"], stdin=TIMER)
    sizes = ",".join(map(str, SIZES))
    timer = [AGENT_PYTHON, "/run/eviction-timer.py", CGROUP, sizes, str(REPEATS)]
    runs = [json.loads(line) for line in vm.exec(timer, timeout=600).stdout.splitlines()]
    stop_workload(vm, out)
    figures: dict[str, Any] = {}
    for anon, kind in ((False, "file"), (True, "anon")):
        for pages in SIZES:
            mine = [r for r in runs if r["anon"] is anon and r["pages"] == pages]
            ms = statistics.median(r["ms"] for r in mine)
            mib = pages * 4096 / MIB
            figures[f"{kind}_{mib:g}_mib"] = {
                "median_ms": ms,
                "ms": [r["ms"] for r in mine],
                "stolen_pages": [r["stolen"] for r in mine],
                "mib_per_s": round(mib / (ms / 1000), 1) if ms else None,
            }
    return figures
