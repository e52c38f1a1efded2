"""The "kata-fc" kernel configuration: PSI built but off (booted psi=0) and the multi-gen LRU
built but off at boot, as Kata's and Firecracker's guest kernels ship (tests/vm/kernels.py).
The agent turns the multi-gen LRU and delay accounting on as it starts; the reclaimer then
gives cold memory back on delay accounting's stall, within the PSI run's bounds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import boot_and_record
from tests.vm.kernels import (
    KATA_FC,
    absent,
    audit_lines,
    check_no_thrash,
    check_off_then_on,
    check_trigger_fires_under_pressure,
)
from tests.vm.pace import Pace

pytestmark = pytest.mark.vm

RESULTS: dict[str, Any] = {"kernel_cmdline_added": KATA_FC.extra_cmdline}


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    yield from boot_and_record(KATA_FC, image, tmp_path_factory, RESULTS, "kata_fc")


def test_the_agent_turned_on_delay_accounting_and_the_multigen_lru(
    vm: GuestVM, agent: AgentClient
) -> None:
    assert vm.exec(["cat", "/proc/sys/kernel/task_delayacct"]).stdout.strip() == "1"
    enabled = vm.exec(["cat", "/sys/kernel/mm/lru_gen/enabled"]).stdout.strip()
    assert int(enabled, 16) & 1, enabled
    # The init left both off, so each change is on record.
    for setting, before in (("kernel.task_delayacct", "0"), ("lru_gen/enabled", "0x0000")):
        (line,) = audit_lines(vm, setting)
        assert line["request"]["before"] == before and line["code"] == "OK", line
    reasons = absent(agent.info())
    assert set(reasons) == {"psi"}, reasons
    RESULTS["lru_gen_enabled"] = enabled


def test_cold_memory_goes_back_on_delay_accounting(vm: GuestVM, agent: AgentClient) -> None:
    check_off_then_on(vm, agent, RESULTS)


def test_no_thrash_on_delay_accounting(vm: GuestVM, agent: AgentClient) -> None:
    check_no_thrash(vm, agent, RESULTS)


def test_an_explicit_pressure_trigger_fires_under_pressure(
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> None:
    RESULTS["trigger"] = check_trigger_fires_under_pressure(vm, agent, pace)
