"""Confidential guests' overheads, from the only figures there are: a published survey.

`measure-overhead` cannot boot an SEV-SNP or TDX guest here, so the models for those
platforms are fitted, by the same rule as a measured model's, to the RuntimeClass overhead
survey of edgelesssys/contrast pull request 1196 ("nodeinstaller: align default_memory and
overhead to actual usage", 2025-01-29): Kata pods on AKS with Cloud Hypervisor and SEV-SNP,
and on K3s with QEMU and TDX, default_memory 256 MiB, one container of 50 to 4096 MiB, each
observed once ready. docs/sizing.md carries the tables and says what drives the figures.

The kernel reserve is fitted as the envelope of two lines: it is nearly flat up to about
1 GiB and steep above, where the guest's swiotlb outgrows its 64 MiB floor. Pure data and
functions; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from guestagent.errors import InvalidArgument
from guestagent.host.sizing.model import DEFAULT_MODEL, OverheadModel, fit_envelope, fit_line
from guestagent.host.sizing.plan import DEFAULT_BLOCK_SIZE
from guestagent.sizes import MIB

PLAIN = "plain"
SEV_SNP = "sev-snp"  # The platform names MemoryInfo.confidential reports.
TDX = "tdx"
PLATFORMS = (PLAIN, SEV_SNP, TDX)
SURVEY = "edgelesssys/contrast#1196"


@dataclass(frozen=True)
class SurveyRow:
    """One pod as published, in bytes; None where the survey gives no figure."""

    default_memory: int
    limit: int
    vm_size: int  # default_memory + limit: the VM a static-sized runtime boots
    free_total: int  # `free -m` total in the guest: MemTotal, whole MiB
    free_used: int  # `free -m` used: the guest's daemons (no workload ran)
    memory_current: int | None  # the pod's cgroup on the host, bytes as published
    overhead_vm: int  # vm_size - free_total: the kernel's reserve
    overhead_host: int | None  # memory_current - vm_size, rounded to MiB

    @property
    def host_overhead(self) -> int | None:
        """memory.current beyond the VM, from the exact byte count where there is one."""
        if self.memory_current is not None:
            return self.memory_current - self.vm_size
        return self.overhead_host


def _row(
    default_mib: int,
    limit_mib: int,
    vm_mib: int,
    total_mib: int,
    used_mib: int,
    current: int | None,
    overhead_vm_mib: int,
    overhead_host_mib: int | None,
) -> SurveyRow:
    return SurveyRow(
        default_memory=default_mib * MIB,
        limit=limit_mib * MIB,
        vm_size=vm_mib * MIB,
        free_total=total_mib * MIB,
        free_used=used_mib * MIB,
        memory_current=current,
        overhead_vm=overhead_vm_mib * MIB,
        overhead_host=None if overhead_host_mib is None else overhead_host_mib * MIB,
    )


# The survey's tables as published (MiB, memory.current in bytes).
SEV_SNP_ROWS = (
    _row(256, 50, 306, 197, 27, 335077376, 109, 14),
    _row(256, 150, 406, 295, 26, 432263168, 111, 6),
    _row(256, 500, 756, 640, 30, 801509376, 116, 8),
    _row(256, 1024, 1280, 1090, 32, 1353519104, 190, 11),
    _row(256, 2048, 2304, 1965, 31, 2431700992, 339, 15),
    _row(256, 4096, 4352, 3716, 47, 4587950080, 636, 23),
)
TDX_ROWS = (
    _row(256, 50, 306, 207, 49, 355393536, 99, 33),
    _row(256, 150, 406, 305, 49, 466104320, 101, 39),
    _row(256, 500, 756, 650, 52, 841797632, 106, 47),
    _row(256, 1024, 1280, 1100, 53, 1387155456, 180, 43),
    _row(256, 2048, 2304, 1976, 62, 2462515200, 328, 44),
    _row(256, 4096, 4352, 3727, 74, None, 625, None),
)
SURVEY_ROWS = {SEV_SNP: SEV_SNP_ROWS, TDX: TDX_ROWS}
SETUPS = {SEV_SNP: "AKS, Cloud Hypervisor", TDX: "K3s, QEMU"}


def survey_model(rows: Sequence[SurveyRow], source: str) -> OverheadModel:
    """The kernel reserve as an envelope (its growth changes near 1 GiB), the daemons and the
    host's overhead as lines (the survey found both nearly flat); a row without a figure is
    left out of that figure's fit."""
    hosts = [(r.vm_size, h) for r in rows if (h := r.host_overhead) is not None]
    return OverheadModel(
        kernel=fit_envelope([(r.vm_size, r.overhead_vm) for r in rows]),
        daemons=fit_line([(r.vm_size, r.free_used) for r in rows]),
        vmm=fit_line(hosts),
        source=source,
        fitted_sizes=tuple(sorted({r.vm_size for r in rows})),
    )


CONFIDENTIAL_MODELS = {
    platform: survey_model(
        rows, f"{platform} ({SETUPS[platform]}), fitted to the survey in {SURVEY}"
    )
    for platform, rows in SURVEY_ROWS.items()
}


def platform_model(platform: str) -> OverheadModel:
    """The built-in model for a platform: plain is the conservative default."""
    if platform == PLAIN:
        return DEFAULT_MODEL
    try:
        return CONFIDENTIAL_MODELS[platform]
    except KeyError:
        raise InvalidArgument(
            f"platform {platform!r} is not one of {', '.join(PLATFORMS)}"
        ) from None


def platform_block_size(platform: str) -> int:
    """Kata hotplugs no memory into a confidential guest: it sizes the VM once, at creation
    (static_sandbox_resource_mgmt), to default_memory plus the limits, not rounded to blocks."""
    return 0 if platform in CONFIDENTIAL_MODELS else DEFAULT_BLOCK_SIZE
