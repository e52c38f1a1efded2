"""`guestctl give-back --follow` through the Firecracker stand-in (tests/standins/: its
documented API over a unix socket, driving this QEMU guest's balloon over QMP, since
Firecracker does not run here without KVM): the follow scenario of test_giveback_follow.py,
the balloon read back through `GET /balloon/statistics`, and every request body the stand-in
received checked against the VMM's published schema. A guest of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.vm.qemu import GuestVM
from tests.standins.firecracker import FirecrackerStandIn
from tests.vm.follow import FOLLOW_GUEST, through
from tests.vm.guest import module_guest
from tests.vm.pace import Pace

pytestmark = pytest.mark.vm

RESULTS: dict[str, Any] = {}

vm = module_guest(FOLLOW_GUEST, RESULTS, "giveback_fc")


def test_follow_through_firecracker(
    vm: GuestVM, agent: AgentClient, pace: Pace, tmp_path: Path
) -> None:
    figures = through(FirecrackerStandIn, "firecracker", vm, agent, pace, tmp_path)
    RESULTS["firecracker"] = figures
    assert "PATCH /balloon" in figures["requests"], figures["requests"]
    assert "GET /balloon/statistics" in figures["requests"], figures["requests"]
