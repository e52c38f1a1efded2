"""give-back through Cloud Hypervisor's and Firecracker's APIs: the backends read as tables, and
the whole command against each stand-in (tests/standins/) over the fake QEMU monitor, every
request body checked against the VMM's published schema and every answer the stand-in gave
against the schema the client reads it by."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from guestagent.host import ctl
from guestagent.host.giveback import oneshot
from guestagent.host.giveback.follow import knob_for
from guestagent.host.giveback.oneshot import Options, Settled, give_back
from guestagent.host.giveback.plan import BALLOON, VIRTIO_MEM, Refused, plan_balloon
from guestagent.host.giveback.text import result_text
from guestagent.host.vmm import cloud_hypervisor, firecracker
from guestagent.host.vmm.base import Balloon, VmmError
from guestagent.host.vmm.cloud_hypervisor import CloudHypervisorVmm
from guestagent.host.vmm.firecracker import FirecrackerVmm
from guestagent.host.vmm.qemu import QemuMonitor
from guestagent.host.vmm.unixhttp import UnixHttpClient
from guestagent.sizes import GIB, MIB
from tests.fakes.giveback import FakeAgent, report
from tests.fakes.qmp import FakeQemu
from tests.standins import schema
from tests.standins.cloud_hypervisor import CloudHypervisorStandIn
from tests.standins.firecracker import FirecrackerStandIn
from tests.standins.server import StandIn


def options(**changes: Any) -> Options:
    base: dict[str, Any] = dict(
        via=BALLOON, to=None, force=False, dry_run=False, device=None, settle_timeout=30.0
    )
    return Options(**{**base, **changes})


@pytest.fixture
def qemu(tmp_path: Path) -> Iterator[FakeQemu]:
    with FakeQemu(tmp_path / "qmp.sock") as fake:
        yield fake


@pytest.fixture
def ch(qemu: FakeQemu, tmp_path: Path) -> Iterator[CloudHypervisorStandIn]:
    with CloudHypervisorStandIn(tmp_path / "ch.sock", qemu.path) as stand_in:
        yield stand_in  # type: ignore[misc]
    conforms(schema.CLOUD_HYPERVISOR, stand_in)


@pytest.fixture
def fc(qemu: FakeQemu, tmp_path: Path) -> Iterator[FirecrackerStandIn]:
    with FirecrackerStandIn(tmp_path / "fc.sock", qemu.path) as stand_in:
        yield stand_in  # type: ignore[misc]
    conforms(schema.FIRECRACKER, stand_in)


def conforms(vmm: str, stand_in: StandIn) -> None:
    """Every body the stand-in received follows the VMM's schema."""
    assert schema.received_errors(vmm, stand_in.received) == []


def answers_conform(vmm: str, path: Path) -> None:
    """What the stand-in answers follows the schema the client reads it by."""
    prefix = "/api/v1" if vmm == schema.CLOUD_HYPERVISOR else ""
    client = UnixHttpClient(str(path), 5.0)
    for (method, endpoint), name in schema.ANSWERS[vmm].items():
        answer = client.request(method, endpoint.removeprefix(prefix) if not prefix else endpoint)
        assert schema.errors(vmm, name, answer) == [], (endpoint, answer)


def test_the_schema_check_catches_a_wrong_or_unknown_field() -> None:
    ch, fc = schema.CLOUD_HYPERVISOR, schema.FIRECRACKER
    assert schema.request_errors(ch, "PUT", "/api/v1/vm.resize", {"desired_balloon": 4096}) == []
    assert schema.request_errors(ch, "PUT", "/api/v1/vm.resize", {"desired_balloon": "1G"})
    assert schema.request_errors(ch, "PUT", "/api/v1/vm.resize", {"balloon": 4096})
    assert schema.request_errors(fc, "PATCH", "/balloon", {"amount_mib": 1}) == []
    assert schema.request_errors(fc, "PATCH", "/balloon", {})  # amount_mib is required
    assert schema.request_errors(fc, "PATCH", "/hotplug/memory", {"requested_size_mib": -2})
    assert schema.request_errors(fc, "GET", "/balloon", {"amount_mib": 1})


CH_INFO: dict[str, Any] = {
    "config": {
        "payload": {},
        "memory": {
            "size": GIB,
            "hotplug_method": "VirtioMem",
            "hotplug_size": GIB,
            "hotplugged_size": 512 * MIB,
        },
        "balloon": {"size": 300 * MIB, "deflate_on_oom": True},
    },
    "state": "Running",
    # Boot RAM less the balloon's 256 MiB actual, plus 512 MiB plugged.
    "memory_actual_size": GIB - 256 * MIB + 512 * MIB,
}


def test_cloud_hypervisors_balloon_and_virtio_mem_from_vm_info() -> None:
    balloon = cloud_hypervisor.balloon_of(CH_INFO)
    assert balloon == Balloon(GIB + 512 * MIB, 256 * MIB, 300 * MIB, 4096, True)
    (device,) = cloud_hypervisor.virtio_mem_of(CH_INFO)
    # Read with the balloon taken as settled at what it was asked (300 MiB, holding 256): the
    # 44 MiB it has yet to take show as plugged.
    assert (device.id, device.memaddr, device.max_size) == ("mem0", None, GIB)
    assert (device.size, device.requested_size) == (556 * MIB, 512 * MIB)
    assert cloud_hypervisor.resize_request(CH_INFO, device, 256 * MIB) == (
        "/vm.resize",
        {"desired_ram": GIB + 256 * MIB},
    )
    zoned = json.loads(json.dumps(CH_INFO))
    zoned["config"]["memory"]["zones"] = [
        {"id": "z1", "size": 256 * MIB, "hotplug_size": GIB, "hotplugged_size": 128 * MIB}
    ]
    (zone,) = cloud_hypervisor.virtio_mem_of(zoned)
    assert cloud_hypervisor.resize_request(zoned, zone, 64 * MIB) == (
        "/vm.resize-zone",
        {"id": "z1", "desired_ram": 320 * MIB},
    )
    with pytest.raises(VmmError, match="no balloon"):
        cloud_hypervisor.balloon_of({**CH_INFO, "config": {"memory": {"size": GIB}}})


def test_firecrackers_balloon_is_in_mib_and_read_from_statistics() -> None:
    config = {"amount_mib": 300, "deflate_on_oom": False}
    stats = {"target_pages": 76800, "actual_pages": 51200, "target_mib": 300, "actual_mib": 200}
    assert firecracker.balloon_of(config, stats, 1024, 0) == Balloon(
        GIB, 200 * MIB, 300 * MIB, MIB, False
    )
    # Without statistics (not enabled at boot) only what was asked is known.
    unseen = firecracker.balloon_of(config, None, 1024, 0)
    assert (unseen.taken, unseen.observed) == (300 * MIB, False)


@pytest.mark.parametrize(
    ("unit", "to", "value"),
    [
        (4096, None, 400 * MIB),  # MemTotal 1000 less the target 600 MiB.
        (MIB, None, 400 * MIB),
        (4096, 300 * MIB + 1, 300 * MIB),  # Takes less, rounding down: still safe.
        (MIB, 300 * MIB + 4096, 300 * MIB),
    ],
)
def test_a_balloon_sized_by_what_it_takes(unit: int, to: int | None, value: int) -> None:
    balloon = Balloon(GIB, 0, 0, unit, False)
    step = plan_balloon(report(), balloon, False, to, False)
    assert (step.value, step.safe, step.ram) == (value, 400 * MIB, GIB)


def test_taking_more_than_the_safe_size_is_refused_naming_both() -> None:
    with pytest.raises(Refused, match=rf"--to {500 * MIB} .* above the safe balloon size"):
        plan_balloon(report(), Balloon(GIB, 0, 0, MIB, False), False, 500 * MIB, False)


@pytest.mark.parametrize("deflate_on_oom", [False, True])
def test_the_safe_size_is_the_same_with_deflate_on_oom_on_or_off(deflate_on_oom: bool) -> None:
    """With it off the balloon lowers MemTotal; with it on MemTotal stays and the agent counts
    the balloon's pages as unreclaimable kernel memory, so its target rises by them. Either
    way the balloon may hold 1000 - 600 MiB in all."""
    held = 100 * MIB
    mem_total = 1000 * MIB if deflate_on_oom else 900 * MIB
    target = 600 * MIB + held if deflate_on_oom else 600 * MIB
    balloon = Balloon(GIB, held, held, 4096, deflate_on_oom)
    step = plan_balloon(report(mem_total, target), balloon, False, None, False)
    assert step.value == 400 * MIB


def test_give_back_through_cloud_hypervisor(ch: CloudHypervisorStandIn, qemu: FakeQemu) -> None:
    vmm = CloudHypervisorVmm(str(ch.api_path), 5.0)
    result = give_back(FakeAgent(report()), vmm, options(), None)
    assert result.vmm == "cloud-hypervisor"
    assert result.settled is not None and result.settled.how == "reached"
    assert result.step.value == 400 * MIB  # desired_balloon: what it takes
    assert qemu.actual == GIB - 400 * MIB
    assert [r.body for r in ch.received if r.method == "PUT"] == [{"desired_balloon": 400 * MIB}]
    answers_conform(schema.CLOUD_HYPERVISOR, ch.api_path)


def test_virtio_mem_through_cloud_hypervisor(ch: CloudHypervisorStandIn, qemu: FakeQemu) -> None:
    vmm = CloudHypervisorVmm(str(ch.api_path), 5.0)
    result = give_back(FakeAgent(report(vmem_safe=401 * MIB)), vmm, options(via=VIRTIO_MEM), None)
    assert result.step.device == "mem0" and qemu.vmem_requested == 402 * MIB
    assert {"desired_ram": GIB + 402 * MIB} in [r.body for r in ch.received]


def test_give_back_through_firecracker(fc: FirecrackerStandIn, qemu: FakeQemu) -> None:
    vmm = FirecrackerVmm(str(fc.api_path), 5.0)
    result = give_back(FakeAgent(report(mem_total=1000 * MIB + 5)), vmm, options(), None)
    # 400 MiB and 5 bytes may go: amount_mib rounds down to 400.
    assert result.step.value == 400 * MIB
    assert result.settled is not None and result.settled.how == "reached"
    assert qemu.actual == GIB - 400 * MIB
    assert [r.body for r in fc.received if r.method == "PATCH"] == [{"amount_mib": 400}]
    # Each settle poll is one read of what the balloon holds, not four.
    requests = [f"{r.method} {r.path}" for r in fc.received]
    polls = requests[requests.index("PATCH /balloon") + 1 :]
    assert polls and set(polls) == {"GET /balloon/statistics"}, requests
    answers_conform(schema.FIRECRACKER, fc.api_path)


def test_without_balloon_statistics_give_back_says_it_did_not_see_the_balloon_settle(
    fc: FirecrackerStandIn, qemu: FakeQemu
) -> None:
    fc.statistics_enabled = False
    vmm = FirecrackerVmm(str(fc.api_path), 5.0)
    result = give_back(FakeAgent(report(mem_total=1000 * MIB + 5)), vmm, options(), None)
    assert result.settled == Settled("unobserved", 0.0, 400 * MIB, [])
    assert [r.body for r in fc.received if r.method == "PATCH"] == [{"amount_mib": 400}]
    text = result_text(result)
    assert "balloon asked for 400.0 MiB, not seen to settle" in text, text
    assert "reached" not in text, text


def test_virtio_mem_through_firecracker(fc: FirecrackerStandIn, qemu: FakeQemu) -> None:
    vmm = FirecrackerVmm(str(fc.api_path), 5.0)
    give_back(FakeAgent(report(vmem_safe=401 * MIB)), vmm, options(via=VIRTIO_MEM), None)
    assert qemu.vmem_requested == 402 * MIB
    assert {"requested_size_mib": 402} in [r.body for r in fc.received]


def test_a_vmm_refusal_is_one_line_naming_the_request_and_its_fault(
    fc: FirecrackerStandIn, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(oneshot, "ClientAgent", lambda client, cold: FakeAgent(report()))
    argv = ["--target", "unix:///nowhere", "give-back", "--vmm", "firecracker"]
    argv += ["--api", str(fc.api_path), "--to", "2G", "--force"]
    assert ctl.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert 'PATCH /balloon {"amount_mib": 1024}' in err or "amount_mib" in err, err
    assert "HTTP 400" in err and "too large" in err, err


def test_qmp_is_qemus_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--target", "unix:///x", "give-back", "--vmm", "firecracker", "--qmp", "q", "--safe"]
    with pytest.raises(SystemExit) as exited:
        ctl.main(argv)
    assert exited.value.code == 2 and "--api" in capsys.readouterr().err


def test_follows_knob_on_a_virtio_mem_device_counts_what_it_unplugged(
    fc: FirecrackerStandIn, qemu: FakeQemu
) -> None:
    vmm = FirecrackerVmm(str(fc.api_path), 5.0)
    knob = knob_for(vmm, VIRTIO_MEM, None)
    reading = knob.read(report(vmem_safe=401 * MIB))
    # 1 GiB plugged at the start; the figure lets it go to 402 MiB (whole 2 MiB blocks).
    assert (reading.taken, reading.safe, reading.unit) == (0, 622 * MIB, 2 * MIB)
    knob.set(622 * MIB)
    assert qemu.vmem_requested == 402 * MIB and knob.asked() == 622 * MIB
    assert {"requested_size_mib": 402} in [r.body for r in fc.received]


def test_a_monitor_whose_qemu_is_gone_fails_its_commands_and_closes_quietly(
    qemu: FakeQemu,
) -> None:
    """A follow loop whose VM was killed closes its connection on the way out: qemu.qmp's
    disconnect raises the EOFError that ended it, which must not end the loop's last line."""
    monitor = QemuMonitor(str(qemu.path), 5.0)
    assert monitor.cmd("query-balloon") == {"actual": qemu.actual}
    qemu.hang_up()
    with pytest.raises(VmmError, match="QMP query-balloon"):
        monitor.cmd("query-balloon")
    monitor.close()
