"""The agent as give-back and its follow loop see it: a memory report with the give-back
figures, and a compaction; each call is noted."""

from __future__ import annotations

from guestagent.sizes import GIB, MIB
from guestagent.v1 import agent_pb2 as pb

ADDR = 0x100000000  # where the virtio-mem region starts in the reports


def report(
    mem_total: int = 1000 * MIB,
    safe_target: int | None = 600 * MIB,
    vmem_safe: int | None = None,
    fragmented: int | None = None,
) -> pb.MemoryInfo:
    info = pb.MemoryInfo(system=pb.SystemMemory(mem_total_bytes=mem_total))
    if fragmented is not None:  # Free memory in blocks free page reporting does not take.
        info.giveback.free_fragmented.CopyFrom(pb.Figure(bytes=fragmented))
    if safe_target is not None:
        info.giveback.safe_balloon_target.CopyFrom(
            pb.Figure(bytes=safe_target, reason="working set 300 MiB + kernel 60 MiB + headroom")
        )
    if vmem_safe is not None:
        info.hotplug.virtio_mem.append(pb.VirtioMemRegion(device="virtio4", start_address=ADDR))
        info.giveback.virtio_mem.append(
            pb.VirtioMemTarget(
                device="virtio4",
                plugged_bytes=GIB,
                safe_requested_size=pb.Figure(bytes=vmem_safe, reason="holder fits in 1 block"),
            )
        )
    return info


class FakeAgent:
    def __init__(self, info: pb.MemoryInfo) -> None:
        self.info = info
        self.calls: list[str] = []

    def report(self) -> pb.MemoryInfo:
        self.calls.append("report")
        return self.info

    def compact(self) -> pb.CompactResult:
        self.calls.append("compact")
        return pb.CompactResult(free_huge_bytes_before=10 * MIB, free_huge_bytes_after=90 * MIB)
