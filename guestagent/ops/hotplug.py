"""Online hot-plugged memory: the host plugs a DIMM or grows a virtio-mem device, and the
guest must online the new blocks, in a zone that decides whether they can be unplugged.

The kernel leaves hot-added blocks offline here (no MEMORY_HOTPLUG_DEFAULT_ONLINE), so the
agent onlines them at start and on every "memory" add event (udev's, or the kernel's without
udevd), read by the event loop off the uevent socket: no thread waits for them. Blocks the
kernel (or anyone) onlined already are left as they are: the agent never fights
auto-onlining.

The default policy, "auto-movable", follows the kernel's own auto-movable online policy
(Documentation/admin-guide/mm/memory-hotplug.rst): hot-plugged blocks go to ZONE_MOVABLE,
from which virtio-mem can always unplug them again, as long as movable memory stays within
movable_ratio percent of the boot memory in kernel zones; blocks beyond that go to a kernel
zone. ZONE_MOVABLE cannot hold kernel allocations (page tables, dentries, inodes, the
memmap of the movable memory itself), so a guest grown far past its boot memory with
everything movable runs out of kernel memory while most of its RAM is free, and the OOM
killer acts. 301 is the kernel's default ratio: 3:1, plus 1 % for firmware holes.
"online", "online_movable" and "online_kernel" write that state to every block instead.
"""

from __future__ import annotations

import socket
import threading
from typing import TYPE_CHECKING

from guestagent.errors import AgentError, FailedPrecondition, InvalidArgument
from guestagent.jsonlog import EventLog
from guestagent.linux.kernel import Kernel
from guestagent.linux.memblocks import (
    MemoryBlock,
    block_size_bytes,
    block_state,
    read_memory_blocks,
    read_virtio_mem_regions,
    set_block_state,
)
from guestagent.linux.meminfo import read_system_memory
from guestagent.linux.uevents import is_memory_added, open_uevents, read_uevents
from guestagent.records import record

if TYPE_CHECKING:  # The command line imports this module before it may import asyncio.
    import asyncio

log = EventLog("guestagent.ops.hotplug")

AUTO_MOVABLE = "auto-movable"
ONLINE_STATES = ("online", "online_movable", "online_kernel")
POLICIES = (AUTO_MOVABLE, *ONLINE_STATES)
DEFAULT_MOVABLE_RATIO = 301


@record
class OnlinePolicy:
    mode: str = AUTO_MOVABLE
    # Movable memory at most this many percent of the boot memory in kernel zones.
    movable_ratio: int = DEFAULT_MOVABLE_RATIO

    def __post_init__(self) -> None:
        if self.mode not in POLICIES:
            raise InvalidArgument(
                f"online policy {self.mode!r} is not one of {', '.join(POLICIES)}",
                "OPTION_INVALID",
                metadata={"option": "online-memory", "value": self.mode},
            )
        if self.movable_ratio < 0:
            raise InvalidArgument(
                f"movable ratio {self.movable_ratio} % is negative",
                "OPTION_INVALID",
                metadata={"option": "movable-ratio", "value": self.movable_ratio},
            )


@record
class OnlineResult:
    onlined: tuple[str, ...]
    failed: tuple[str, ...]  # "memory42: write ...: EBUSY ..." for blocks the kernel refused.
    mem_total: int
    block_size: int
    movable: tuple[str, ...] = ()  # Those of `onlined` that went to ZONE_MOVABLE.


def online_states(policy: OnlinePolicy, blocks: list[MemoryBlock]) -> dict[int, str]:
    """The state to write to each offline block, lowest block first.

    Boot memory is counted in whole online blocks that were not hot-plugged and are not
    movable; every movable block, hot-plugged or not, counts against the ratio.
    """
    offline = sorted(b.index for b in blocks if b.state == "offline")
    if policy.mode != AUTO_MOVABLE:
        return {index: policy.mode for index in offline}
    boot_kernel = sum(1 for b in blocks if b.online and not b.hotplugged and not b.movable)
    movable = sum(1 for b in blocks if b.movable)
    states = {}
    for index in offline:
        if (movable + 1) * 100 <= policy.movable_ratio * boot_kernel:
            states[index] = "online_movable"
            movable += 1
        else:
            states[index] = "online_kernel"
    return states


def online_memory(kernel: Kernel, policy: OnlinePolicy = OnlinePolicy()) -> OnlineResult:
    blocks = read_memory_blocks(kernel, read_virtio_mem_regions(kernel))
    onlined, movable, failed = [], [], []
    for index, state in online_states(policy, blocks).items():
        name = f"memory{index}"
        try:
            set_block_state(kernel, name, state)
        except AgentError as e:
            # The kernel's auto-onlining (or another writer) may have got there first.
            if block_state(kernel, name) != "online":
                failed.append(f"{name}: {e}")
            continue
        onlined.append(name)
        if state == "online_movable":
            movable.append(name)
    result = OnlineResult(
        tuple(onlined),
        tuple(failed),
        read_system_memory(kernel).mem_total,
        block_size_bytes(kernel) if blocks else 0,
        tuple(movable),
    )
    if onlined or failed:
        log.info(
            "memory_onlined",
            blocks=len(onlined),
            movable=len(movable),
            failed=list(failed),
            mem_total=result.mem_total,
            policy=policy.mode,
        )
    return result


class HotplugWatcher:
    """Onlines memory when a block is added (udev or kernel uevents): the event loop reads
    the events, a blocking-pool thread makes the pass."""

    def __init__(self, kernel: Kernel, policy: OnlinePolicy | None) -> None:
        """policy None: onlining is off (--online-memory off), on demand too."""
        self.kernel = kernel
        self.policy = policy
        self._lock = threading.Lock()  # Blocks appear in bursts; one pass at a time.
        self._events: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pass_queued = False  # A burst of events makes one more pass, not one each.

    def online_now(self) -> OnlineResult:
        if self.policy is None:
            raise FailedPrecondition(
                "onlining hot-plugged memory is off in this agent (--online-memory off)",
                "ONLINE_MEMORY_OFF",
            )
        with self._lock:
            return online_memory(self.kernel, self.policy)

    async def start(self) -> None:
        import asyncio

        self._loop = asyncio.get_running_loop()
        self._events = open_uevents(self.kernel)
        self._loop.add_reader(self._events, self._events_arrived, self._events, self._loop)
        # After the socket listens, so no block is missed in between; on a thread, since
        # onlining many blocks must not hold up any call.
        await asyncio.to_thread(self.online_now)

    def _events_arrived(self, events: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        read, lost = read_uevents(events)
        if (lost or any(is_memory_added(e) for e in read)) and not self._pass_queued:
            self._pass_queued = True
            loop.run_in_executor(None, self._online_pass)

    def _online_pass(self) -> None:
        self._pass_queued = False  # Events from here on queue another pass.
        try:
            self.online_now()
        except AgentError as e:
            log.error("online_failed", error=str(e))

    def stop(self) -> None:
        if self._events is not None and self._loop is not None:
            self._loop.remove_reader(self._events)
            self._events.close()
            self._events = None
