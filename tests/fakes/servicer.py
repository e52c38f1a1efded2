"""The agent's servicer over a fake tree, and the parts of a gRPC context it uses, for the
servicer's unit tests (no server, no socket)."""

from __future__ import annotations

import asyncio
from typing import Any, NoReturn

import grpc

from guestagent.agent.on_first_use import OnFirstUse
from guestagent.agent.peers import PeerTable
from guestagent.agent.rpc import MemoryAgentServicer
from guestagent.host.refusal import refusal_from
from guestagent.linux.confidential import decide, read_facts
from guestagent.ops.hotplug import HotplugWatcher, OnlinePolicy
from guestagent.ops.idle import IdleAger
from guestagent.ops.swap import SwapManager
from guestagent.ops.workingset.reclaimer import Reclaimer
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.root import FakeRoot


class Aborted(Exception):
    pass


class FakeContext:
    """The parts of grpc.aio.ServicerContext the servicer uses."""

    def __init__(self, peer: str = "ipv4:127.0.0.1:40000") -> None:
        self._peer = peer
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailer: tuple[tuple[str, bytes], ...] = ()

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        return None

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: tuple[tuple[str, bytes], ...] = (),
    ) -> NoReturn:
        self.code, self.details, self.trailer = code, details, trailing_metadata
        raise Aborted

    @property
    def reason(self) -> str:
        """The refusal's ErrorInfo.reason, from the Status in the trailer."""
        return refusal_from(self.code or grpc.StatusCode.OK, self.details, self.trailer).reason


def make_servicer(fake_root: FakeRoot, ager: IdleAger | None = None) -> MemoryAgentServicer:
    fs = fake_root.fs
    reclaimer = OnFirstUse(lambda: Reclaimer(fs), "the reclaimer")
    return MemoryAgentServicer(
        fs,
        asyncio.Event(),
        OnFirstUse(lambda: SwapManager(fs), "swap"),
        HotplugWatcher(fs, OnlinePolicy("online")),
        reclaimer,
        lambda cgroups: reclaimer().overview(cgroups),  # The daemon's, once built.
        PeerTable(),
        ager or IdleAger(fs),
        stall=None,
        confidential=decide("auto", read_facts(fs)),
    )


async def memory_info(
    servicer: MemoryAgentServicer, request: pb.GetMemoryInfoRequest, context: Any
) -> pb.MemoryInfo:
    """GetMemoryInfo's answer decoded: the servicer answers it encoded (agent/shared_answers.py)."""
    return pb.MemoryInfo.FromString(await servicer.GetMemoryInfo(request, context))
