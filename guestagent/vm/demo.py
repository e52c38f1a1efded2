"""`make run`: boot the guest image in QEMU and show the agent at work, as guestctl shows it.

The host talks to the agent through QEMU's forwarded port (this machine has no vhost-vsock);
inside the guest the agent also listens on vsock, which the VM tests exercise.
"""

from __future__ import annotations

import shlex
import sys
import time

from guestagent.host.ctl import main as ctl_main
from guestagent.sizes import MIB
from guestagent.vm.qemu import Disk, GuestVM, VMConfig

FILLER = (
    "import time; b = bytearray(200 << 20); "
    "[b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; time.sleep(3600)"
)


def guestctl(target: str, *args: str) -> None:
    print(f"\n$ guestctl --target {target} {shlex.join(args)}", flush=True)
    if ctl_main(["--target", target, *args]) != 0:
        raise SystemExit(f"guestctl {' '.join(args)} failed")


def heading(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def main() -> int:
    config = VMConfig(memory_mib=512, disks=(Disk("swap", 1 << 30, serial="swap0"),))
    heading("booting the guest image under QEMU")
    with GuestVM(config) as vm:
        print(f"booted and serving in {vm.boot_seconds:.1f} s; agent at {vm.agent_target}")
        target = vm.agent_target
        guestctl(target, "health")
        heading("the guest's memory, as the agent reports it")
        guestctl(target, "info")

        heading("swap: find the disk by its virtio serial, make it non-rotational, enable it")
        guestctl(target, "swap", "enable", "--serial", "swap0", "--priority", "10")
        guestctl(target, "swap", "enable", "--serial", "swap0")
        print("(the second call changed nothing: one shared area per pod)")

        heading("limits from OCI values: limit 64 MiB, memory+swap total 256 MiB")
        guestctl(target, "limits", "--cgroup", "demo", "--limit", "-1", "--create")
        guestctl(
            target,
            "limits",
            "--cgroup",
            "demo/app",
            "--limit",
            "64M",
            "--swap",
            "256M",
            "--reservation",
            "16M",
            "--create",
        )
        print("(memory.swap.max is the total minus the limit: 192 MiB of swap alone)")

        heading("the container allocates 200 MiB: reclaimed into swap, not killed")
        vm.exec(
            "sh -c 'echo $$ > /sys/fs/cgroup/demo/app/cgroup.procs; echo $$ > /run/demo.pid; "
            "exec python3 -c "
            f'"{FILLER}"\' </dev/null >/dev/null 2>&1 &'
        )
        time.sleep(20)
        guestctl(target, "info", "--cgroup", "demo/app")
        print(f"host: the sparse swap file holds {vm.disk_allocated_bytes('swap') / MIB:.0f} MiB")

        heading("giving memory back: reclaim, then compaction before the host's balloon")
        guestctl(target, "reclaim", "now", "--cgroup", "demo/app", "--bytes", "32M")
        vm.exec("kill $(cat /run/demo.pid)")  # By pid: a pattern would match this shell too.
        time.sleep(8)
        print(
            f"host: after the process exited, {vm.disk_allocated_bytes('swap') / MIB:.0f} MiB "
            "(discard gave the rest back)"
        )
        guestctl(target, "compact")
        guestctl(target, "swap", "list")
        guestctl(target, "overhead", "--workload", "demo")

        heading("the working-set reclaimer: a cold 200 MiB goes back to the host by itself")
        vm.exec(
            "mkdir -p /sys/fs/cgroup/demo/cold && sh -c 'echo $$ > /sys/fs/cgroup/demo/cold/"
            "cgroup.procs; echo $$ > /run/cold.pid; exec python3 -c "
            f'"{FILLER}"\' </dev/null >/dev/null 2>&1 &'
        )
        time.sleep(20)
        before = vm.qemu_rss_bytes()
        print(f"host: QEMU RSS {before / MIB:.0f} MiB with the policy off")
        guestctl(target, "reclaim", "on", "--cgroup", "demo/cold", "--anon")
        time.sleep(45)
        guestctl(target, "reclaim", "status")
        print(f"host: QEMU RSS {before / MIB:.0f} -> {vm.qemu_rss_bytes() / MIB:.0f} MiB")
        guestctl(target, "reclaim", "off", "--cgroup", "demo/cold")
        vm.exec("kill $(cat /run/cold.pid)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
