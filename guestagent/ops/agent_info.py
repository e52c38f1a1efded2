"""GetAgentInfo's answer: what this agent is and what it can do here, asked once by a host.

The contract revision counts changes a host may need to know of beyond new fields (which an
older agent ignores and leaves unset): docs/contract.md lists each revision.
"""

from __future__ import annotations

from guestagent import __version__
from guestagent.errors import ERROR_DOMAIN
from guestagent.linux.delayacct import DelayStallMeter
from guestagent.linux.features import DELAYACCT, IDLE_AGES, Absent, read_features
from guestagent.linux.kernel import Kernel
from guestagent.ops.idle import NOT_AGED, IdleState
from guestagent.records import record

# 1: the contract before GetAgentInfo. 2: GetAgentInfo, refusal reasons (ErrorInfo), watch
# streams that report a removed cgroup and go on. 3: every stream message is GetMemoryInfo's
# report. 4: SetReclaimPolicy's workloads (docs/contract.md lists each).
CONTRACT_REVISION = 4


@record
class AgentInfo:
    version: str
    contract_revision: int
    # Each optional feature by name, with why the kernel lacks it (None: present).
    features: tuple[tuple[str, Absent | None], ...]
    error_domain: str = ERROR_DOMAIN


def agent_info(
    kernel: Kernel, stall: DelayStallMeter | None = None, idle: IdleState | None = None
) -> AgentInfo:
    """`stall`: the agent's delay-accounting meter, which knows whether taskstats answers.
    `idle`: the aging loop's state, which knows when the agent ages nothing (--idle-aging 0)
    or cannot read the ages (no debugfs), beyond what the kernel has."""
    features = dict(read_features(kernel))
    if idle is not None and idle.absent is not None and idle.absent is not NOT_AGED:
        features[IDLE_AGES] = Absent(IDLE_AGES, idle.absent.reason)
    features[DELAYACCT] = (
        stall.absence()
        if stall is not None
        else Absent(DELAYACCT, "this agent reads no delay accounting")
    )
    return AgentInfo(__version__, CONTRACT_REVISION, tuple(features.items()))
