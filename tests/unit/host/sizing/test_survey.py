"""plan --platform sev-snp / tdx against every row of the survey its models are fitted to."""

from __future__ import annotations

import pytest

from guestagent.errors import InvalidArgument
from guestagent.host.sizing.model import DEFAULT_MODEL, Envelope
from guestagent.host.sizing.plan import DEFAULT_BLOCK_SIZE, Plan, PodSizing, plan
from guestagent.host.sizing.survey import (
    PLAIN,
    SEV_SNP,
    SURVEY_ROWS,
    TDX,
    SurveyRow,
    platform_block_size,
    platform_model,
)
from guestagent.sizes import MIB
from tests.fakes.sizing import HOST, limits

ROWS = [(platform, row) for platform, rows in SURVEY_ROWS.items() for row in rows]
IDS = [f"{platform}-{row.limit // MIB}Mi" for platform, row in ROWS]
# How far above the survey's rows each fitted line may lie: the kernel's envelope follows
# every row to within a MiB; the daemons and the host's overhead are single lines through
# noisy, nearly flat figures (docs/sizing.md lists the distance at each row).
KERNEL_MARGIN = MIB
DAEMONS_MARGIN = {SEV_SNP: 7 * MIB, TDX: 3 * MIB}
HOST_MARGIN = {SEV_SNP: 8 * MIB, TDX: 13 * MIB}


def survey_plan(platform: str, row: SurveyRow, pod_limit: int | None = None) -> Plan:
    sizing = PodSizing(
        host_memory=HOST,
        default_memory=row.default_memory,
        containers=limits(row.limit // MIB),
        pod_limit=pod_limit,
        block_size=platform_block_size(platform),
    )
    return plan(sizing, platform_model(platform))


@pytest.mark.parametrize(("platform", "row"), ROWS, ids=IDS)
def test_rows_are_carried_over_consistently(platform: str, row: SurveyRow) -> None:
    assert row.vm_size == row.default_memory + row.limit
    assert row.overhead_vm == row.vm_size - row.free_total
    if row.overhead_host is not None and row.host_overhead is not None:
        assert round(row.host_overhead / MIB) * MIB == row.overhead_host


@pytest.mark.parametrize(("platform", "row"), ROWS, ids=IDS)
def test_plan_reproduces_the_row_never_below_it(platform: str, row: SurveyRow) -> None:
    result = survey_plan(platform, row)
    # A confidential VM is sized exactly: 256 + 50 MiB is a 306 MiB VM, as in the survey.
    assert result.vm_size == row.vm_size
    assert 0 <= result.kernel - row.overhead_vm <= KERNEL_MARGIN
    assert 0 <= result.daemons - row.free_used <= DAEMONS_MARGIN[platform]
    if row.host_overhead is not None:
        assert 0 <= result.vmm - row.host_overhead <= HOST_MARGIN[platform]


@pytest.mark.parametrize(("platform", "row"), ROWS, ids=IDS)
def test_warns_where_the_survey_says_containers_cannot_reach_their_limits(
    platform: str, row: SurveyRow
) -> None:
    # Measured room for the container: MemTotal less what the guest's own daemons use.
    short = row.free_total - row.free_used < row.limit
    result = survey_plan(platform, row)
    warned = [w for w in result.warnings if "does not hold the guest's own" in w]
    assert bool(warned) == short
    assert (result.container_room < row.limit) == short


# RuntimeClass overheads: Kata's default, default_memory alone (nothing for the host's own
# processes), the plans' own figure for small pods, and the survey's recommendation.
DECLARED_MIB = (160, 256, 270, 300, 320)
HOST_ROWS = [(platform, row) for platform, row in ROWS if row.memory_current is not None]
HOST_IDS = [f"{platform}-{row.limit // MIB}Mi" for platform, row in HOST_ROWS]


@pytest.mark.parametrize(("platform", "row"), HOST_ROWS, ids=HOST_IDS)
@pytest.mark.parametrize("declared_mib", DECLARED_MIB)
def test_preflight_fails_where_the_measured_pod_outgrew_its_limit(
    platform: str, row: SurveyRow, declared_mib: int
) -> None:
    assert row.memory_current is not None
    pod_limit = row.limit + declared_mib * MIB  # as Kubernetes sets it
    result = survey_plan(platform, row, pod_limit)
    if row.memory_current > pod_limit:  # the host would OOM-kill this pod
        assert not result.ok
        assert result.shortfall >= row.memory_current - pod_limit
    elif row.memory_current + HOST_MARGIN[platform] <= pod_limit:
        assert result.ok


def test_the_smallest_pods_fail_with_overhead_declared_as_default_memory_only() -> None:
    for platform in (SEV_SNP, TDX):
        smallest = SURVEY_ROWS[platform][0]
        result = survey_plan(platform, smallest, smallest.limit + smallest.default_memory)
        assert not result.ok
        # ... and pass with what plan says to declare.
        declared = smallest.limit + result.runtime_class_overhead
        assert survey_plan(platform, smallest, declared).ok


@pytest.mark.parametrize("platform", [SEV_SNP, TDX])
def test_plain_declares_too_little_kernel_for_a_large_confidential_guest(platform: str) -> None:
    largest = SURVEY_ROWS[platform][-1]
    assert DEFAULT_MODEL.kernel.at(largest.vm_size) < largest.overhead_vm
    assert isinstance(platform_model(platform).kernel, Envelope)


def test_beyond_the_survey_the_figures_are_extrapolated() -> None:
    sizing = PodSizing(
        host_memory=HOST, default_memory=256 * MIB, containers=limits(8192), block_size=0
    )
    (warning, *_) = [w for w in plan(sizing, platform_model(TDX)).warnings if "outside" in w]
    assert "(306 MiB to 4352 MiB)" in warning


def test_plain_is_todays_model_and_block_rounding() -> None:
    assert platform_model(PLAIN) is DEFAULT_MODEL
    assert platform_block_size(PLAIN) == DEFAULT_BLOCK_SIZE
    assert platform_block_size(SEV_SNP) == platform_block_size(TDX) == 0
    with pytest.raises(InvalidArgument, match="'sev' is not one of plain, sev-snp, tdx"):
        platform_model("sev")
