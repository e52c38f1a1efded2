"""Encrypted swap's cost for the bench JSON: a workload's swap-out and swap-in throughput
through dm-crypt (EPHEMERAL) and straight to the disk (NONE), in the same boot, alternated.
No target: the figure users ask for (docs/confidential-swap.md)."""

from __future__ import annotations

from typing import Any

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import make_cgroup

MIB = 1 << 20
WORKLOAD_MIB = 200
ROUNDS = 2
# Writes every page of MiB (out to swap past the cgroup's 32 MiB), then reads every page
# back (in from swap): the seconds of each pass.
SWAPPER = """
import sys, time
size = int(sys.argv[1]) << 20
started = time.monotonic()
block = bytearray(size)
for offset in range(0, size, 4096):
    block[offset] = 1
written = time.monotonic()
total = 0
for offset in range(0, size, 4096):
    total += block[offset]
print(written - started, time.monotonic() - written)
"""


def swap_pass(vm: GuestVM) -> tuple[float, float]:
    out = vm.exec(
        "sh -c 'echo $$ > /sys/fs/cgroup/bench/cgroup.procs; "
        f"exec python3 /run/swapper.py {WORKLOAD_MIB}'",
        timeout=1800,
    ).stdout.split()
    return float(out[0]), float(out[1])


def measure_crypt_swap() -> dict[str, Any]:
    config = VMConfig(
        memory_mib=512,
        disks=(
            Disk("crypt", 512 * MIB, serial="crypt0"),
            Disk("plain", 512 * MIB, serial="plain0"),
        ),
    )
    runs: dict[str, list[dict[str, float]]] = {"ephemeral": [], "none": []}
    with GuestVM(config) as vm, AgentClient(vm.agent_target, timeout=600) as agent:
        agent.wait_ready(60)
        make_cgroup(vm, "bench", memory_max="32M")
        vm.exec(["sh", "-c", "cat > /run/swapper.py"], stdin=SWAPPER)
        for _ in range(ROUNDS):
            for kind, serial, encryption in (
                ("ephemeral", "crypt0", pb.SWAP_ENCRYPTION_EPHEMERAL),
                ("none", "plain0", pb.SWAP_ENCRYPTION_NONE),
            ):
                selector = pb.DeviceSelector(serial=serial)
                agent.enable_swap(pb.EnableSwapRequest(device=selector, encryption=encryption))
                out_s, in_s = swap_pass(vm)
                agent.disable_swap(selector)
                runs[kind].append(
                    {
                        "swap_out_mib_s": round(WORKLOAD_MIB / out_s, 1),
                        "swap_in_mib_s": round(WORKLOAD_MIB / in_s, 1),
                    }
                )

    def best(kind: str, figure: str) -> float:
        return max(run[figure] for run in runs[kind])

    return {
        "workload_mib": WORKLOAD_MIB,
        "cgroup_memory_max_mib": 32,
        "runs": runs,
        "ratio_ephemeral_to_none": {
            figure: round(best("ephemeral", figure) / best("none", figure), 3)
            for figure in ("swap_out_mib_s", "swap_in_mib_s")
        },
    }
