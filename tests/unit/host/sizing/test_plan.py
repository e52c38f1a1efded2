"""The plan rules: hotplug clamping, the preflight, the declared overhead, refusals, warnings."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guestagent.errors import InvalidArgument
from guestagent.host.sizing.model import DEFAULT_MODEL, fit_model
from guestagent.host.sizing.plan import Container, PodSizing, hotplug_amount, plan, vm_ceiling
from guestagent.sizes import MIB
from tests.fakes.sizing import FLAT, HOST, limits, sample


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
        # The pod: no refusal, hotplug up to the host's memory.
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
        (1184, False, 1988),  # the worker: 1 GiB limit + Kata's 160 MiB overhead
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
