"""A swap area as calls ask for it and answers describe it (EnableSwap's spec, the area, their
enums), apart from the machinery that enables it (swap.py): the agent loads that, with
device-mapper, libudev and the disk probes, at the first swap call, or at start when an
earlier agent left swap state or a mapping of its own behind.
"""

from __future__ import annotations

import enum

from guestagent.errors import InvalidArgument
from guestagent.linux.abi import SWAP_FLAG_PRIO_MASK
from guestagent.linux.device_selector import DeviceSelector
from guestagent.linux.dm_mappings import Mapping, read_mappings
from guestagent.linux.kernel import Kernel
from guestagent.linux.statestore import SWAPS, state_file
from guestagent.records import record

DEFAULT_LABEL = "guestagent-swap"
# A mapping's name is this and its disk's kernel name; a restarted agent finds its own by it.
MAPPING_PREFIX = "guestagent-swap-"


class DiscardPolicy(enum.Enum):
    BOTH = "both"  # Discard the whole area at swapon, and each cluster as it frees.
    PAGES = "pages"  # Only clusters as they free: what gives memory back to the host.
    ONCE = "once"  # Only the whole area at swapon.
    NONE = "none"


class SwapEncryption(enum.Enum):
    DEFAULT = "default"  # EPHEMERAL in a confidential guest, NONE elsewhere.
    NONE = "none"
    EPHEMERAL = "ephemeral"  # dm-crypt with a random key that lives only in the kernel.


@record
class EnableSwapSpec:
    selector: DeviceSelector
    priority: int | None = None
    discard: DiscardPolicy = DiscardPolicy.BOTH
    wait_ms: int = 0
    force: bool = False
    label: str = DEFAULT_LABEL
    encryption: SwapEncryption = SwapEncryption.DEFAULT

    def __post_init__(self) -> None:
        if self.priority is not None and not 0 <= self.priority <= SWAP_FLAG_PRIO_MASK:
            raise InvalidArgument(
                f"swap priority {self.priority} is outside 0..32767",
                "SWAP_PRIORITY_INVALID",
                field="priority",
            )
        if len(self.label.encode()) > 16:
            raise InvalidArgument(
                f"swap label {self.label!r} is longer than 16 bytes",
                "SWAP_LABEL_TOO_LONG",
                field="label",
            )


@record
class SwapArea:
    device: str
    size_bytes: int
    used_bytes: int
    priority: int
    # The defaults: an area this agent cannot look into (a swap file, a device node gone).
    discard: DiscardPolicy | None = None  # None: enabled by someone else, policy unknown.
    discard_supported: bool = False
    rotational: bool | None = None
    uuid: str = ""
    label: str = ""
    already_active: bool = False
    formatted: bool = False
    encrypted: bool = False
    mapping: str = ""  # /dev/mapper/NAME of an encrypted area.
    backing_device: str = ""  # The disk under it, e.g. /dev/vdb.


def decode_swap_state(value: object) -> dict[str, dict[str, str]]:
    """The saved swap state: text by text by device; TypeError for anything else."""
    if not isinstance(value, dict) or not all(
        isinstance(entry, dict) and all(isinstance(v, str) for v in entry.values())
        for entry in value.values()
    ):
        raise TypeError("not an object of objects of strings")
    return value


def our_mappings(kernel: Kernel) -> list[Mapping]:
    """The device-mapper mappings an agent made for encrypted swap (by their name)."""
    return [m for m in read_mappings(kernel) if m.name.startswith(MAPPING_PREFIX)]


def left_behind(kernel: Kernel) -> bool:
    """Whether an earlier agent left swap state or a mapping of its own, which the start
    then checks (SwapManager.check_state); else nothing of swap's needs to load."""
    return state_file(kernel, SWAPS).exists() or bool(our_mappings(kernel))
