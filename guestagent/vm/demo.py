"""`make run`: boot the guest image in QEMU and show the agent at work, as guestctl shows it.

The host talks to the agent through QEMU's forwarded port (this machine has no vhost-vsock);
inside the guest the agent also listens on vsock, which the VM tests exercise. Each step waits
for what it shows (the agent SERVING, the memory touched, the reclaimer's progress), never
for a fixed time: a TCG guest's pace varies several-fold with the host's load.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable

from guestagent.host.client import AgentClient
from guestagent.host.ctl import main as ctl_main
from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.sizes import MIB
from guestagent.vm.qemu import GuestVM

# Touches 200 MiB, then creates the file its argument names. No quotes: it goes inside two.
FILLER = (
    "import pathlib, sys, time; b = bytearray(200 << 20); "
    "[b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; "
    "pathlib.Path(sys.argv[1]).touch(); time.sleep(3600)"
)
# Generous for a TCG guest on a loaded host; each is a bound, not a wait.
SERVING_TIMEOUT_S = 120.0
STEP_TIMEOUT_S = 300.0
# The reclaimer gives a cold set back over a few of its intervals; what counts as shown.
COLD_GIVEN_BACK = 100 * MIB


def guestctl(target: str, command: str) -> None:
    """Run and show one guestctl command line, given as typed."""
    print(f"\n$ guestctl --target {target} {command}", flush=True)
    if ctl_main(["--target", target, *shlex.split(command)]) != 0:
        raise SystemExit(f"guestctl {command} failed")


def heading(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def wait_for(check: Callable[[], bool], what: str, timeout: float = STEP_TIMEOUT_S) -> float:
    """Poll check() until true; returns the seconds it took. Past timeout, fail naming what."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"demo: no {what} after {timeout:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - start


def health_once_serving(target: str, timeout: float = SERVING_TIMEOUT_S) -> None:
    """`guestctl health` once the agent says SERVING: its gRPC port answers before it has
    loaded its state, and says NOT_SERVING until then (agent/daemon.py)."""
    with AgentClient(target) as client:
        seconds = client.wait_ready(timeout)
    print(f"(SERVING {seconds:.1f} s after its port first answered)")
    guestctl(target, "health")


def start_filler(vm: GuestVM, cgroup: str, name: str) -> None:
    """Run FILLER in cgroup and wait until its 200 MiB are touched."""
    ready = f"/run/{name}.ready"
    vm.exec(
        f"mkdir -p /sys/fs/cgroup/{cgroup} && sh -c 'echo $$ > /sys/fs/cgroup/{cgroup}/"
        f"cgroup.procs; echo $$ > /run/{name}.pid; exec python3 -c "
        f'"{FILLER}" {ready}\' </dev/null >/dev/null 2>&1 &'
    )
    seconds = wait_for(lambda: vm.exec(["test", "-e", ready], check=False).rc == 0, ready)
    print(f"(200 MiB touched in {seconds:.0f} s)")


def steady(read: Callable[[], int], tolerance: int) -> Callable[[], bool]:
    """A check that holds once two readings in a row differ by at most tolerance."""
    last: list[int] = []

    def check() -> bool:
        last.append(read())
        return len(last) > 1 and abs(last[-1] - last[-2]) <= tolerance

    return check


def main() -> int:
    config = VMConfig(memory_mib=512, disks=(Disk("swap", 1 << 30, serial="swap0"),))
    heading("booting the guest image under QEMU")
    with GuestVM(config) as vm:
        print(f"booted in {vm.boot_seconds:.1f} s; agent at {vm.agent_target}")
        target = vm.agent_target
        health_once_serving(target)
        heading("the guest's memory, as the agent reports it")
        guestctl(target, "info")

        heading("swap: find the disk by its virtio serial, make it non-rotational, enable it")
        guestctl(target, "swap enable --serial swap0 --priority 10")
        guestctl(target, "swap enable --serial swap0")
        print("(the second call changed nothing: one shared area per pod)")

        heading("limits from OCI values: limit 64 MiB, memory+swap total 256 MiB")
        guestctl(target, "limits --cgroup demo --limit -1 --create")
        guestctl(
            target, "limits --cgroup demo/app --limit 64M --swap 256M --reservation 16M --create"
        )
        print("(memory.swap.max is the total minus the limit: 192 MiB of swap alone)")

        heading("the container allocates 200 MiB: reclaimed into swap, not killed")
        start_filler(vm, "demo/app", "demo")
        guestctl(target, "info --cgroup demo/app")
        print(f"host: the sparse swap file holds {vm.disk_allocated_bytes('swap') / MIB:.0f} MiB")

        heading("giving memory back: reclaim, then compaction before the host's balloon")
        guestctl(target, "reclaim now --cgroup demo/app --bytes 32M")
        vm.exec("kill $(cat /run/demo.pid)")  # By pid: a pattern would match this shell too.
        wait_for(
            steady(lambda: vm.disk_allocated_bytes("swap"), tolerance=MIB),
            "steady swap file after the discards",
        )
        print(
            f"host: after the process exited, {vm.disk_allocated_bytes('swap') / MIB:.0f} MiB "
            "(discard gave the rest back)"
        )
        guestctl(target, "compact")
        guestctl(target, "swap list")
        guestctl(target, "overhead --workload demo")

        heading("the working-set reclaimer: a cold 200 MiB goes back to the host by itself")
        start_filler(vm, "demo/cold", "cold")
        before = vm.qemu_rss_bytes()
        print(f"host: QEMU RSS {before / MIB:.0f} MiB with the policy off")
        guestctl(target, "reclaim on --cgroup demo/cold --anon")
        with AgentClient(target) as client:
            seconds = wait_for(
                lambda: reclaimed_bytes(client, "demo/cold") >= COLD_GIVEN_BACK,
                f"{COLD_GIVEN_BACK // MIB} MiB reclaimed from demo/cold",
            )
        print(f"({COLD_GIVEN_BACK // MIB} MiB reclaimed in {seconds:.0f} s)")
        guestctl(target, "reclaim status")
        print(f"host: QEMU RSS {before / MIB:.0f} -> {vm.qemu_rss_bytes() / MIB:.0f} MiB")
        guestctl(target, "reclaim off --cgroup demo/cold")
        vm.exec("kill $(cat /run/cold.pid)")
    return 0


def reclaimed_bytes(client: AgentClient, cgroup: str) -> int:
    status = client.reclaim_status([cgroup])
    return sum(target.reclaimed_total_bytes for target in status.targets)


if __name__ == "__main__":
    sys.exit(main())
