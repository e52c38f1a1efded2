"""Things VM tests do inside the guest: make cgroups, fill memory, wait for the kernel."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from guestagent.host.client import AgentClient
from guestagent.vm.qemu import GuestVM, VMConfig

T = TypeVar("T")

# Allocates and touches MiB of anonymous memory, says so in a marker file, then sleeps
# until killed. Each page gets one non-zero byte so the kernel must really store it.
FILLER = """
import sys, time
size = int(sys.argv[1]) << 20
block = bytearray(size)
for offset in range(0, size, 4096):
    block[offset] = 1
open(sys.argv[2], "w").write("ready")
time.sleep(3600)
"""


def boot(config: VMConfig, image: Path, factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    """Body of a module's `vm` fixture: boot, hand over, and stop the guest at the end."""
    with GuestVM(config, image_dir=image, workdir=factory.mktemp("vm")) as guest:
        yield guest


def boot_and_record(
    config: VMConfig,
    image: Path,
    factory: pytest.TempPathFactory,
    results: dict[str, object],
    name: str,
) -> Iterator[GuestVM]:
    """boot(), noting the boot-to-serving time in results, which are then saved as
    tests/vm/results/NAME.json once the guest is stopped."""
    for guest in boot(config, image, factory):
        results["boot_to_serving_seconds"] = round(guest.boot_seconds or 0, 1)
        yield guest
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")


def wait_until(check: Callable[[], T | None], timeout: float, what: str, every: float = 0.5) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def make_cgroup(vm: GuestVM, name: str, **files: str) -> None:
    """mkdir a cgroup under /sys/fs/cgroup and write files, e.g. memory_max="64M"."""
    path = f"/sys/fs/cgroup/{name}"
    writes = "".join(f" && echo {v} > {path}/{k.replace('_', '.')}" for k, v in files.items())
    vm.exec(f"mkdir -p {path}{writes}")


def read_guest(vm: GuestVM, path: str) -> str:
    return vm.exec(["cat", path]).stdout


def start_filler(vm: GuestVM, cgroup: str, mib: int, name: str = "filler") -> str:
    """Start a process in the cgroup that holds `mib` MiB; returns its marker path."""
    marker = f"/run/{name}.ready"
    vm.exec(["rm", "-f", marker])
    vm.exec(["sh", "-c", f"cat > /run/{name}.py"], stdin=FILLER)
    vm.exec(
        f"sh -c 'echo $$ > /sys/fs/cgroup/{cgroup}/cgroup.procs; echo $$ > /run/{name}.pid; "
        f"exec python3 /run/{name}.py {mib} {marker}' </dev/null >/run/{name}.log 2>&1 &"
    )
    return marker


def filler_ready(vm: GuestVM, marker: str) -> bool:
    return vm.exec(["test", "-e", marker], check=False).rc == 0


def stop_filler(vm: GuestVM, name: str = "filler") -> None:
    # By pid: a pattern (pkill -f) would also match the shell that runs the command.
    pid = vm.exec(["cat", f"/run/{name}.pid"]).stdout.strip()
    vm.exec(["kill", pid])
    wait_until(
        lambda: vm.exec(["test", "-d", f"/proc/{pid}"], check=False).rc != 0, 60, f"{name} to exit"
    )


def plug_dimm_and_wait_online(vm: GuestVM, agent: AgentClient, mib: int) -> tuple[int, int]:
    """Plug a pc-dimm and wait for the agent to online all of it: MemTotal before and after."""
    before = agent.info().system.mem_total_bytes
    # MemTotal grows by the DIMM less its memmap (64 bytes per 4 KiB page).
    wanted = before + (mib - 6) * (1 << 20)
    vm.hotplug_dimm(mib)
    grown = wait_until(
        lambda: (total := agent.info().system.mem_total_bytes) >= wanted and total,
        120,
        "MemTotal to grow by the DIMM",
    )
    offline = vm.exec("grep -l offline /sys/devices/system/memory/memory*/state | wc -l").stdout
    assert int(offline) == 0
    return before, grown


def allocate_free_and_compact(
    vm: GuestVM, compact: Callable[[], object], hog_mib: int
) -> dict[str, float]:
    """Allocate hog_mib in the guest, free it, compact, and see how much QEMU's RSS gives up
    (free page reporting hands back freed 2 MiB blocks every 2 s)."""
    mib = 1 << 20
    make_cgroup(vm, "hog")
    time.sleep(5)  # Let boot-time frees be reported first, so the baseline holds still.
    baseline = vm.qemu_rss_bytes()
    marker = start_filler(vm, "hog", hog_mib, name="hog")
    wait_until(lambda: filler_ready(vm, marker), 600, "the hog's allocation")
    peak = vm.qemu_rss_bytes()
    stop_filler(vm, "hog")
    compact()
    time.sleep(8)
    after = vm.qemu_rss_bytes()
    return {
        "hog_mib": hog_mib,
        "qemu_rss_baseline_mib": baseline // mib,
        "qemu_rss_peak_mib": peak // mib,
        "qemu_rss_after_mib": after // mib,
        "returned_fraction_of_hog": round((peak - after) / (hog_mib * mib), 3),
    }
