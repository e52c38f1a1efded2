"""Whether this guest is a confidential one (AMD SEV-SNP, Intel TDX), from what its kernel says.

The facts are read once; one pure function turns them into a platform and the fact that
decided it. Only facts that a guest kernel sets for itself count, never CPU capabilities a
host also shows (an SNP-capable host's cpuinfo lists sev_snp too).
"""

from __future__ import annotations

from guestagent.linux.fs import KernelFS
from guestagent.records import record

SEV_SNP = "sev-snp"
TDX = "tdx"
NONE = "none"
# --confidential=yes on a platform the facts below do not show.
OTHER = "other"
SETTINGS = ("auto", "yes", "no")


@record
class ConfidentialFacts:
    cpu_flags: frozenset[str]
    # arch/x86/kernel/sev.c snp_init_platform_device(): registered only in an SNP guest.
    sev_guest_platform_device: bool
    # drivers/virt/coco/sev-guest/sev-guest.c: the SNP guest request device (module sev-guest).
    sev_guest_node: bool
    # drivers/virt/coco/tdx-guest/tdx-guest.c: the TDX guest attestation device (Linux 6.2+).
    tdx_guest_node: bool


@record
class Confidential:
    platform: str  # sev-snp, tdx, none, or other (declared by --confidential=yes).
    evidence: str  # The fact that decided it, or the flag.

    @property
    def is_confidential(self) -> bool:
        return self.platform != NONE


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The first processor's flags in /proc/cpuinfo (every CPU of a guest has the same)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def detect(facts: ConfidentialFacts) -> Confidential:
    """The platform the kernel's facts show, first fact first."""
    # arch/x86/coco/tdx/tdx.c tdx_early_init() sets X86_FEATURE_TDX_GUEST, shown as tdx_guest.
    if "tdx_guest" in facts.cpu_flags:
        return Confidential(TDX, "cpuinfo flag tdx_guest")
    if facts.tdx_guest_node:
        return Confidential(TDX, "/dev/tdx_guest")
    if facts.sev_guest_platform_device:
        return Confidential(SEV_SNP, "/sys/devices/platform/sev-guest")
    if facts.sev_guest_node:
        return Confidential(SEV_SNP, "/dev/sev-guest")
    return Confidential(NONE, "no SEV-SNP or TDX guest device or cpuinfo flag")


def decide(setting: str, facts: ConfidentialFacts) -> Confidential:
    """--confidential: auto trusts the facts, yes and no overrule them (for tests, and for a
    platform the facts do not show)."""
    if setting not in SETTINGS:
        raise ValueError(f"--confidential {setting!r} is not one of {', '.join(SETTINGS)}")
    found = detect(facts)
    if setting == "auto":
        return found
    if setting == "no":
        overruled = f" (overruling {found.evidence})" if found.is_confidential else ""
        return Confidential(NONE, f"--confidential=no{overruled}")
    platform = found.platform if found.is_confidential else OTHER
    return Confidential(platform, "--confidential=yes")


def read_facts(fs: KernelFS) -> ConfidentialFacts:
    return ConfidentialFacts(
        cpu_flags=cpu_flags(fs.read_optional(fs.proc("cpuinfo")) or ""),
        sev_guest_platform_device=fs.exists(fs.sys("devices", "platform", "sev-guest")),
        sev_guest_node=fs.exists(fs.dev("sev-guest")),
        tdx_guest_node=fs.exists(fs.dev("tdx_guest")),
    )
