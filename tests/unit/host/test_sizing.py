"""VM sizing: hotplug clamping, the preflight, overhead model fitting, and `guestctl plan`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guestagent.errors import InvalidArgument
from guestagent.host.ctl import main as ctl_main
from guestagent.host.measure import Mapping, guest_ram_resident, parse_smaps
from guestagent.host.sizing import (
    DEFAULT_MODEL,
    MIB,
    Container,
    Line,
    OverheadModel,
    OverheadSample,
    PodSizing,
    fit_line,
    fit_model,
    hotplug_amount,
    model_from_dict,
    model_to_dict,
    plan,
    verdict_text,
    vm_ceiling,
)

HOST = 31753 * MIB  # The host of the issue: "maximum amount is 31753 MiB".
# Flat overheads, so every figure below can be worked out by hand.
FLAT = OverheadModel(
    kernel=Line(40 * MIB, 0.0), daemons=Line(60 * MIB, 0.0), vmm=Line(100 * MIB, 0.0), source="flat"
)


def limits(*mib: int | None) -> tuple[Container, ...]:
    return tuple(Container(f"c{i}", None if m is None else m * MIB) for i, m in enumerate(mib))


@pytest.mark.parametrize(
    ("host", "maxmem", "ceiling"),
    [
        (HOST, 0, HOST),  # 0 means the host's memory
        (HOST, 4096 * MIB, 4096 * MIB),
        (HOST, 64000 * MIB, HOST),  # never above the host
        (HOST, HOST, HOST),
    ],
)
def test_vm_ceiling(host: int, maxmem: int, ceiling: int) -> None:
    assert vm_ceiling(host, maxmem) == ceiling


@pytest.mark.parametrize(
    ("default_mib", "maxmem_mib", "block_mib", "container_mib", "wanted", "amount", "clamped"),
    [
        (2048, 0, 0, (), 0, 0, False),
        (2048, 0, 0, (None,), 0, 0, False),  # no limit: contributes nothing
        (2048, 0, 0, (512, 256, None), 768, 768, False),
        # The issue's pod: no refusal, hotplug up to the host's memory.
        (2048, 0, 0, (1024000,), 1024000, 31753 - 2048, True),
        (2048, 0, 128, (1024000,), 1024000, 29696, True),  # whole blocks, under the ceiling
        (2048, 4096, 0, (8192,), 8192, 2048, True),  # default_maxmemory caps it
        (2048, 64000, 0, (40000,), 40000, 31753 - 2048, True),  # maxmem above host: host
        (40000, 0, 0, (1024,), 1024, 0, True),  # default_memory above the host: never negative
        (2048, 0, 128, (100,), 128, 128, False),  # rounded up to a block
        (2048, 0, 128, (128, 128), 256, 256, False),
    ],
)
def test_hotplug_amount(
    default_mib: int,
    maxmem_mib: int,
    block_mib: int,
    container_mib: tuple[int | None, ...],
    wanted: int,
    amount: int,
    clamped: bool,
) -> None:
    result = hotplug_amount(
        PodSizing(
            host_memory=HOST,
            default_memory=default_mib * MIB,
            default_maxmemory=maxmem_mib * MIB,
            containers=limits(*container_mib),
            block_size=block_mib * MIB,
        )
    )
    assert (result.wanted, result.amount, result.clamped) == (wanted * MIB, amount * MIB, clamped)
    assert default_mib * MIB + result.amount <= max(HOST, default_mib * MIB)


def test_limit_above_host_memory_is_clamped_not_refused() -> None:
    sizing = PodSizing(
        host_memory=HOST,
        default_memory=2048 * MIB,
        containers=limits(1024000),
        pod_limit=(1024000 + 1024) * MIB,
        block_size=0,
    )
    result = plan(sizing, FLAT)
    assert result.ok
    assert result.vm_size == HOST
    assert result.hotplug.clamped and result.hotplug.amount == (31753 - 2048) * MIB
    (warning,) = result.warnings
    assert warning.startswith("clamped:") and "31753 MiB (the host's memory)" in warning
    # Clamped, the pod's limits are far above the VM: the declared overhead is the guest's
    # own kernel and daemons plus the VMM.
    assert result.runtime_class_overhead == 200 * MIB


@pytest.mark.parametrize(
    ("pod_limit_mib", "ok", "shortfall_mib"),
    [
        (None, True, 0),  # no pod limit: nothing on the host kills it
        (4000, True, 0),
        (3172, True, 0),  # exactly VM 3072 + VMM 100
        (3171, False, 1),
        (1184, False, 1988),  # the issue's worker: 1 GiB limit + Kata's 160 MiB overhead
        (3072, False, 100),  # at the guest size: OOM-killed once RAM is faulted in
    ],
)
def test_preflight(pod_limit_mib: int | None, ok: bool, shortfall_mib: int) -> None:
    sizing = PodSizing(
        host_memory=HOST,
        default_memory=2048 * MIB,
        containers=limits(1024),
        pod_limit=None if pod_limit_mib is None else pod_limit_mib * MIB,
    )
    result = plan(sizing, FLAT)
    assert (result.vm_size, result.host_usage) == (3072 * MIB, 3172 * MIB)
    assert (result.ok, result.shortfall) == (ok, shortfall_mib * MIB)
    text = verdict_text(result)
    if ok:
        assert text.startswith("preflight ok")
    else:
        assert text.startswith("preflight FAILED")
        assert f"pod limit {pod_limit_mib} MiB" in text and "= 3172 MiB" in text
        assert f"short by {shortfall_mib} MiB" in text


@pytest.mark.parametrize(
    ("default_mib", "container_mib", "overhead_mib"),
    [
        (100, (1024,), 200),  # default_memory = kernel + daemons: VMM + kernel + daemons
        (2048, (1024,), 2148),  # a larger default_memory is held too: 2048 + VMM
        (100, (100,), 228),  # the hotplug rounds 100 up to 128 MiB
        (100, (), 200),
    ],
)
def test_runtime_class_overhead(
    default_mib: int, container_mib: tuple[int, ...], overhead_mib: int
) -> None:
    sizing = PodSizing(
        host_memory=HOST, default_memory=default_mib * MIB, containers=limits(*container_mib)
    )
    assert plan(sizing, FLAT).runtime_class_overhead == overhead_mib * MIB


@given(
    default_mib=st.integers(1, 40000),
    maxmem_mib=st.integers(0, 40000),
    container_mib=st.lists(st.one_of(st.none(), st.integers(1, 1 << 21)), max_size=4),
    block_mib=st.sampled_from([0, 2, 128]),
)
def test_declaring_the_planned_overhead_always_passes(
    default_mib: int, maxmem_mib: int, container_mib: list[int | None], block_mib: int
) -> None:
    sizing = PodSizing(
        host_memory=HOST,
        default_memory=default_mib * MIB,
        default_maxmemory=maxmem_mib * MIB,
        containers=limits(*container_mib),
        block_size=block_mib * MIB,
    )
    first = plan(sizing, DEFAULT_MODEL)
    assert first.hotplug.amount >= 0
    assert first.vm_size <= max(HOST, sizing.default_memory)
    # Kubernetes' pod limit: the containers' limits plus the RuntimeClass overhead.
    pod_limit = sum(m for m in container_mib if m) * MIB + first.runtime_class_overhead
    assert plan(replace(sizing, pod_limit=pod_limit), DEFAULT_MODEL).ok


def test_small_default_memory_warns_that_containers_cannot_reach_their_limits() -> None:
    sizing = PodSizing(host_memory=HOST, default_memory=64 * MIB, containers=limits(512))
    result = plan(sizing, FLAT)
    (warning,) = result.warnings
    assert "default_memory 64 MiB" in warning and "at least 100 MiB" in warning
    assert result.container_room == (64 + 512 - 100) * MIB


def test_request_without_limit_warns() -> None:
    sizing = PodSizing(
        host_memory=HOST,
        default_memory=2048 * MIB,
        containers=(Container("sidecar", request=64 * MIB),),
    )
    (warning,) = plan(sizing, FLAT).warnings
    assert "'sidecar' requests 64 MiB but has no limit" in warning


@pytest.mark.parametrize(
    ("sizing", "message"),
    [
        (PodSizing(host_memory=0, default_memory=MIB), "host memory"),
        (PodSizing(host_memory=HOST, default_memory=0), "default_memory"),
        (PodSizing(host_memory=HOST, default_memory=MIB, default_maxmemory=-1), "maxmemory"),
        (PodSizing(host_memory=HOST, default_memory=MIB, pod_limit=0), "pod limit"),
        (
            PodSizing(HOST, MIB, containers=(Container("a", limit=MIB, request=2 * MIB),)),
            "'a': request 2 MiB is above its limit 1 MiB",
        ),
        (PodSizing(HOST, MIB, containers=(Container("b", limit=-5),)), "'b': limit -5"),
    ],
)
def test_invalid_sizing(sizing: PodSizing, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        plan(sizing)


def test_extrapolation_warns() -> None:
    model = fit_model([sample(306), sample(756)], "two boots")
    sizing = PodSizing(host_memory=HOST, default_memory=128 * MIB, containers=limits(4096))
    assert any("outside the measured sizes" in w for w in plan(sizing, model).warnings)


def test_fit_line_recovers_an_exact_line() -> None:
    line = fit_line([(x * MIB, 30 * MIB + x * MIB // 50) for x in (306, 756, 1280, 2304)])
    assert line.slope == pytest.approx(0.02)
    assert line.intercept == pytest.approx(30 * MIB, abs=1)


def test_fit_line_lies_on_or_above_every_point() -> None:
    points = [(306 * MIB, 41 * MIB), (756 * MIB, 55 * MIB), (1280 * MIB, 57 * MIB)]
    line = fit_line(points)
    assert line.slope > 0
    assert all(line.at(x) >= y for x, y in points)
    assert any(line.at(x) - y < 1024 for x, y in points)  # and touches one


@pytest.mark.parametrize(
    ("points", "constant"),
    [
        ([(306, 55), (756, 50)], 55),  # a negative slope is noise: the largest value
        ([(306, 55)], 55),
        ([(306, 55), (306, 60)], 60),
    ],
)
def test_fit_line_degenerate_cases(points: list[tuple[int, int]], constant: int) -> None:
    assert fit_line(points) == Line(constant, 0.0)


def test_fit_line_needs_points() -> None:
    with pytest.raises(InvalidArgument):
        fit_line([])


def sample(vm_mib: int, present_mib: int | None = None) -> OverheadSample:
    """Synthetic boots: kernel 30 MiB + 2 %, daemons 50 MiB, VMM 80 MiB + 1 %."""
    size = vm_mib * MIB
    kernel = 30 * MIB + size // 50
    return OverheadSample(
        vm_size=size,
        present=(present_mib or vm_mib) * MIB,
        mem_total=size - kernel,
        mem_free=size // 2,
        used=50 * MIB,
        agent_rss=40 * MIB,
        qemu_rss=size // 2 + 80 * MIB + size // 100,
        guest_resident=size // 2,
        guest_resident_method="smaps",
        accel="tcg",
    )


def test_sample_kernel_ignores_the_unpopulated_tail_of_the_last_block() -> None:
    # 306 MiB fills three 128 MiB blocks only partly; the agent counts 384 MiB present.
    partial = sample(306, present_mib=384)
    assert partial.kernel == 30 * MIB + 306 * MIB // 50
    assert partial.vmm == 80 * MIB + 306 * MIB // 100


def test_fit_model_on_synthetic_boots() -> None:
    model = fit_model([sample(m) for m in (306, 406, 756, 1280, 2304)], "synthetic")
    assert model.kernel.slope == pytest.approx(0.02, rel=1e-3)
    assert model.kernel.intercept == pytest.approx(30 * MIB, rel=1e-3)
    assert model.daemons == Line(50 * MIB, 0.0)
    assert model.vmm.slope == pytest.approx(0.01, rel=1e-3)
    assert model.vmm.intercept == pytest.approx(80 * MIB, rel=1e-3)
    assert len(model.samples) == 5


def test_model_json_round_trip() -> None:
    model = fit_model([sample(m) for m in (306, 756, 1280)], "synthetic")
    text = json.dumps(model_to_dict(model))
    assert model_from_dict(json.loads(text)) == model
    assert json.loads(text)["samples"][0]["kernel"] == model.samples[0].kernel


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"format": "other"}, "format"),
        ({**model_to_dict(DEFAULT_MODEL), "vmm": {"slope": 0.1}}, "vmm"),
        ({**model_to_dict(DEFAULT_MODEL), "samples": [{"vm_size": 1}]}, "samples"),
    ],
)
def test_model_from_dict_refuses_malformed_documents(
    document: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        model_from_dict(document)


SMAPS = """\
5624d164d000-5624d1a54000 r--p 00000000 fe:00 2170918                    /usr/bin/qemu-system-x86_64
Size:               4124 kB
Rss:                4100 kB
VmFlags: rd mr mw me sd
7fa3c4c00000-7fa3d7e00000 rw-p 00000000 00:00 0
Size:             313344 kB
Rss:              170000 kB
Pss:              170000 kB
7fa3e4000000-7fa424000000 rwxp 00000000 00:00 0
Size:            1048576 kB
Rss:              288000 kB
7fa500000000-7fa513200000 rw-p 00000000 00:00 0 [heap]
Size:             313344 kB
Rss:                1000 kB
"""


def test_parse_smaps() -> None:
    mappings = parse_smaps(SMAPS)
    assert [m.size for m in mappings] == [0x407000, 306 * MIB, 1024 * MIB, 306 * MIB]
    assert mappings[0].path == "/usr/bin/qemu-system-x86_64"
    assert mappings[1] == Mapping(306 * MIB, "rw-p", "", 170000 * 1024)
    assert mappings[3].path == "[heap]"


@pytest.mark.parametrize(
    ("ram_sizes", "resident"),
    [
        ([306 * MIB], 170000 * 1024),  # the executable 1 GiB TCG buffer is not RAM
        ([1024 * MIB], None),
        ([306 * MIB, 306 * MIB], None),  # two backends, one mapping: not one to one
        ([], 0),
    ],
)
def test_guest_ram_resident(ram_sizes: list[int], resident: int | None) -> None:
    assert guest_ram_resident(parse_smaps(SMAPS), ram_sizes) == resident


def run_plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = ctl_main(["plan", "--host-memory", "31753Mi", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_guestctl_plan_clamps_the_issue_pod(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(capsys, "--container", "limit=1024000Mi", "--pod-limit", "1024200Mi")
    assert code == 0
    assert "hotplug      29696 MiB (clamped from 1024000 MiB)" in out
    assert "warning: clamped:" in out and "preflight ok" in out
    assert "RuntimeClass overhead to declare:" in out


def test_guestctl_plan_fails_a_pod_limit_below_the_vm(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(capsys, "--container", "limit=1Gi", "--pod-limit", "1184Mi")
    assert code == 1
    assert "preflight FAILED: pod limit 1184 MiB is below VM 3072 MiB" in out
    assert "short by" in out


def test_guestctl_plan_json_with_a_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    model_file = tmp_path / "model.json"
    model = fit_model([sample(m) for m in (306, 756, 1280)], "synthetic")
    model_file.write_text(json.dumps(model_to_dict(model)))
    code = ctl_main(
        [
            "--json",
            "plan",
            "--host-memory", "8G",
            "--default-memory", "256",
            "--container", "limit=512Mi,request=256Mi,name=app",
            "--container", "request=64Mi,name=sidecar",
            "--pod-limit", "2G",
            "--model", str(model_file),
        ]
    )  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["ok"]
    assert result["vm_size"] == 768 * MIB
    assert result["model_source"] == "synthetic"
    assert result["vmm"] == model.vmm.at(768 * MIB)
    assert any("'sidecar' requests 64 MiB" in w for w in result["warnings"])


@pytest.mark.parametrize(
    ("model_text", "message"), [("{", "model"), ('{"format": "x"}', "format is 'x'")]
)
def test_guestctl_plan_bad_model_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, model_text: str, message: str
) -> None:
    (tmp_path / "model.json").write_text(model_text)
    code, _, err = run_plan(capsys, "--pod-limit", "1G", "--model", str(tmp_path / "model.json"))
    assert code == 2 and message in err


def test_guestctl_plan_invalid_pod_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_plan(capsys, "--container", "limit=1M,request=2M", "--pod-limit", "1G")
    assert code == 2 and "above its limit" in err


def test_guestctl_commands_that_reach_an_agent_still_need_a_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        ctl_main(["info"])
    assert exit_info.value.code == 2
    assert "info needs --target" in capsys.readouterr().err
