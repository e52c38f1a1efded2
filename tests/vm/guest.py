"""Things VM tests do inside the guest: make cgroups, fill memory, wait for the kernel."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import VMConfig
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import ExecResult, GuestVM
from tests.vm import pace
from tests.vm.pace import Deadline

T = TypeVar("T")
MIB = 1 << 20

GUESTCTL = "/usr/local/bin/guestctl"
# guestctl's own start-up in an idle TCG guest (Python, grpc, protobuf): 3.5-6 s measured.
GUESTCTL_START_SECONDS = 10.0
# virtio-balloon's free page reporting runs 2 s after pages are freed; one window more.
REPORTING_WINDOW_SECONDS = 2.5
# What fill_and_release pushes through a 64 MiB cgroup into swap.
FILL_MIB = 300

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
        pace.measure(guest)
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


def module_guest(config: VMConfig, results: dict[str, object], name: str) -> Any:
    """A module's `vm` fixture (`vm = module_guest(...)`): boot_and_record() once for the
    module, its figures saved as tests/vm/results/NAME.json."""

    @pytest.fixture(scope="module")
    def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
        """This module's own guest (tests/vm/guest.py, module_guest)."""
        yield from boot_and_record(config, image, tmp_path_factory, results, name)

    return vm


def wait_until(check: Callable[[], T | None], timeout: float, what: str, every: float = 0.5) -> T:
    """Poll check() until it returns something true and return that; past timeout, fail
    naming what was waited for and the last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what} (last: {value!r})"
            )
        time.sleep(every)


def wait_until_steady(
    read: Callable[[], int],
    timeout: float,
    what: str,
    tolerance: int,
    window: float,
    done: Callable[[int], bool] = lambda _: True,
) -> int:
    """Read a figure every `window` s until it has moved by at most `tolerance` over one
    window (and done(figure) holds); returns that figure."""
    samples: list[int] = []

    def steady() -> tuple[int] | None:
        samples.append(read())
        if len(samples) < 2 or not done(samples[-1]):
            return None
        return (samples[-1],) if abs(samples[-1] - samples[-2]) <= tolerance else None

    try:
        (value,) = wait_until(steady, timeout, what, every=window)
    except AssertionError as error:
        raise AssertionError(f"{error}; last readings {samples[-4:]}") from None
    return value


def guestctl(vm: GuestVM, target: str, *args: str, deadline: Deadline) -> ExecResult:
    """guestctl run in the guest, its calls given what is left of the test's deadline; the
    command itself is also allowed the interpreter's start-up at the guest's pace."""
    seconds = max(1.0, deadline.remaining())
    return vm.exec(
        [GUESTCTL, "--target", target, "--timeout", f"{seconds:.1f}", *args],
        timeout=seconds + pace.of(vm).scale(GUESTCTL_START_SECONDS),
        check=False,
    )


def kill_agent(vm: GuestVM) -> None:
    """SIGKILL the agent and wait until init has started a new one (a new pid)."""
    old = vm.exec(["pgrep", "-x", "guestagent"]).stdout.split()
    vm.exec("pkill -KILL -x guestagent; true")
    wait_until(
        lambda: (
            (new := vm.exec(["pgrep", "-x", "guestagent"], check=False).stdout.split())
            and not set(new) & set(old)
        ),
        pace.of(vm).scale(60),
        f"init to start a new agent (the killed one was pid {' '.join(old)})",
    )


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
        lambda: vm.exec(["test", "-d", f"/proc/{pid}"], check=False).rc != 0,
        pace.of(vm).scale(60),
        f"{name} (pid {pid}) to exit",
    )


def allocated_after_release(vm: GuestVM, swap_current: str, swapped: int, disk: str) -> int:
    """Once the filler is gone, the bytes of the host's file behind disk still allocated."""
    speed = pace.of(vm)
    # Discards are issued as clusters free, by a kernel worker: once the guest has freed
    # the swap, wait for the host's file to stop shrinking.
    # The cgroup's swap falls as the exited filler's entries are freed; a cluster is
    # discarded only once all of it is free, so wait for that fall to end, not just begin.
    wait_until_steady(
        lambda: int(read_guest(vm, swap_current)),
        speed.scale(60),
        f"the guest to free most of the filler's {swapped // MIB} MiB of swap",
        tolerance=64 << 10,
        window=speed.scale(1.0),
        done=lambda current: current <= swapped / 10,
    )
    return wait_until_steady(
        lambda: vm.disk_allocated_bytes(disk),
        speed.scale(120),
        f"the host's {disk} file to stop shrinking",
        tolerance=MIB,
        window=speed.scale(2.5),
    )


def swap_and_release(vm: GuestVM, cgroup: str, mib: int, disk: str) -> dict[str, float]:
    """Push mib MiB through the cgroup (whose memory.max is below it) into swap on the host
    file behind disk, end it, and see how much of that file the host gets back (discard)."""
    speed = pace.of(vm)
    swap_current = f"/sys/fs/cgroup/{cgroup}/memory.swap.current"
    before = vm.disk_allocated_bytes(disk)
    marker = start_filler(vm, cgroup, mib)
    wait_until(lambda: filler_ready(vm, marker), speed.scale(600), "the filler to allocate")
    swapped = int(read_guest(vm, swap_current))
    peak = vm.disk_allocated_bytes(disk)
    stop_filler(vm)
    after = allocated_after_release(vm, swap_current, swapped, disk)
    released = (peak - after) / peak if peak else 0.0
    return {
        "swapped_mib": round(swapped / MIB, 1),
        "allocated_before_mib": round(before / MIB, 1),
        "allocated_peak_mib": round(peak / MIB, 1),
        "allocated_after_mib": round(after / MIB, 1),
        "released_fraction": round(released, 3),
    }


def plug_dimm_and_wait_online(vm: GuestVM, agent: AgentClient, mib: int) -> tuple[int, int]:
    """Plug a pc-dimm and wait for the agent to online all of it: MemTotal before and after."""
    before = agent.info().system.mem_total_bytes
    # MemTotal grows by the DIMM less its memmap (64 bytes per 4 KiB page).
    wanted = before + (mib - 6) * (1 << 20)
    vm.hotplug_dimm(mib)
    grown = wait_until(
        lambda: (total := agent.info().system.mem_total_bytes) >= wanted and total,
        pace.of(vm).scale(120),
        "MemTotal to grow by the DIMM",
    )
    offline = vm.exec("grep -l offline /sys/devices/system/memory/memory*/state | wc -l").stdout
    assert int(offline) == 0
    return before, grown


def allocate_free_and_compact(
    vm: GuestVM, compact: Callable[[], object], hog_mib: int
) -> dict[str, float]:
    """Allocate hog_mib in the guest, free it, compact, and see how much QEMU's RSS gives up
    (free page reporting hands back freed 2 MiB blocks every 2 s). RSS here is without TCG's
    translated code, which grows whatever the guest holds (GuestVM.qemu_guest_rss_bytes)."""
    mib = 1 << 20
    speed = pace.of(vm)
    make_cgroup(vm, "hog")
    # Boot-time frees are reported first, so the baseline holds still.
    baseline = wait_until_steady(
        vm.qemu_guest_rss_bytes,
        speed.scale(60),
        "QEMU's RSS to hold still before the hog",
        tolerance=4 * mib,
        window=speed.scale(REPORTING_WINDOW_SECONDS),
    )
    marker = start_filler(vm, "hog", hog_mib, name="hog")
    wait_until(lambda: filler_ready(vm, marker), speed.scale(600), "the hog's allocation")
    peak = vm.qemu_guest_rss_bytes()
    stop_filler(vm, "hog")
    compact()
    # Reporting hands the blocks back a batch every 2 s: wait until it has begun (a tenth
    # of the hog back) and then stops.
    after = wait_until_steady(
        vm.qemu_guest_rss_bytes,
        speed.scale(120),
        f"QEMU's RSS to fall from its {peak // mib} MiB peak and hold still",
        tolerance=4 * mib,
        window=speed.scale(REPORTING_WINDOW_SECONDS),
        done=lambda rss: peak - rss >= hog_mib * mib // 10,
    )
    return {
        "hog_mib": hog_mib,
        "qemu_rss_baseline_mib": baseline // mib,
        "qemu_rss_peak_mib": peak // mib,
        "qemu_rss_after_mib": after // mib,
        "returned_fraction_of_hog": round((peak - after) / (hog_mib * mib), 3),
    }


def node_of(vm: GuestVM, serial: str) -> str:
    """The disk's node (/dev/vdX) from udev's by-id link for its virtio serial."""
    return vm.exec(["readlink", "-f", f"/dev/disk/by-id/virtio-{serial}"]).stdout.strip()


def rotational(vm: GuestVM, serial: str) -> str:
    """The disk's queue/rotational as the guest's sysfs says it: "0" or "1"."""
    name = node_of(vm, serial).removeprefix("/dev/")
    return read_guest(vm, f"/sys/block/{name}/queue/rotational").strip()


def enable(agent: AgentClient, **kwargs: object) -> pb.SwapArea:
    """EnableSwap with the request's fields as keywords."""
    return agent.enable_swap(pb.EnableSwapRequest(**kwargs))  # type: ignore[arg-type]


def fill_and_release(vm: GuestVM, disk: str) -> dict[str, float]:
    """Push FILL_MIB through a 64 MiB cgroup into swap, end it, and watch the host's file."""
    make_cgroup(vm, "fill", memory_max="64M")
    return swap_and_release(vm, "fill", FILL_MIB, disk)


def expect_error(call: object, code: grpc.StatusCode, *words: str) -> str:
    """call() fails with code and details holding every word; returns the details."""
    with pytest.raises(grpc.RpcError) as raised:
        call()  # type: ignore[operator]
    assert raised.value.code() == code, raised.value.details()
    details = raised.value.details() or ""
    for word in words:
        assert word in details, details
    return details


def kb_field(text: str, key: str) -> int:
    """A "Key:  123 kB" line of /proc/meminfo or /proc/PID/status, in bytes."""
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == key:
            return int(rest.split()[0]) * 1024
    raise AssertionError(f"no {key} line in {text[:200]!r}")


def meminfo_bytes(vm: GuestVM, key: str) -> int:
    return kb_field(vm.exec(["cat", "/proc/meminfo"]).stdout, key)


def oom_kills(vm: GuestVM) -> int:
    """The guest's oom_kill count from /proc/vmstat."""
    for line in vm.exec(["cat", "/proc/vmstat"]).stdout.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill":
            return int(value)
    raise AssertionError("no oom_kill in /proc/vmstat")


def expect_ext4_refused(agent: AgentClient, serial: str, device: str) -> None:
    """EnableSwap on a disk holding ext4 fails, naming the disk and why, and formats nothing."""
    expect_error(
        lambda: enable(agent, device=pb.DeviceSelector(serial=serial)),
        grpc.StatusCode.FAILED_PRECONDITION,
        device,
        "ext2/3/4",
        "refusing to format",
    )
