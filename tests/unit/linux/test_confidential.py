import pytest

from guestagent.linux.confidential import (
    Confidential,
    ConfidentialFacts,
    cpu_flags,
    decide,
    detect,
    read_facts,
)
from tests.fakes.root import FakeRoot

CPUINFO = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\n"
    "flags\t\t: fpu vme de pse tsc msr hypervisor tdx_guest\n\n"
    "processor\t: 1\nflags\t\t: fpu\n"
)


def facts(
    flags: str = "", platform: bool = False, sev: bool = False, tdx: bool = False
) -> ConfidentialFacts:
    return ConfidentialFacts(frozenset(flags.split()), platform, sev, tdx)


def test_cpu_flags_of_the_first_processor() -> None:
    assert cpu_flags(CPUINFO) == {
        "fpu",
        "vme",
        "de",
        "pse",
        "tsc",
        "msr",
        "hypervisor",
        "tdx_guest",
    }
    assert cpu_flags("processor : 0\n") == frozenset()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (facts(), Confidential("none", "no SEV-SNP or TDX guest device or cpuinfo flag")),
        (facts("hypervisor tdx_guest"), Confidential("tdx", "cpuinfo flag tdx_guest")),
        (facts(tdx=True), Confidential("tdx", "/dev/tdx_guest")),
        (facts(platform=True), Confidential("sev-snp", "/sys/devices/platform/sev-guest")),
        (facts(sev=True), Confidential("sev-snp", "/dev/sev-guest")),
        # A host's capability flags say nothing about the guest.
        (
            facts("sev sev_es sev_snp"),
            Confidential("none", "no SEV-SNP or TDX guest device or cpuinfo flag"),
        ),
    ],
)
def test_detect(given: ConfidentialFacts, expected: Confidential) -> None:
    assert detect(given) == expected


@pytest.mark.parametrize(
    ("setting", "given", "platform", "evidence"),
    [
        ("auto", facts(sev=True), "sev-snp", "/dev/sev-guest"),
        ("yes", facts(), "other", "--confidential=yes"),
        ("yes", facts(platform=True), "sev-snp", "--confidential=yes"),
        ("no", facts(), "none", "--confidential=no"),
        ("no", facts("tdx_guest"), "none", "--confidential=no (overruling cpuinfo flag tdx_guest)"),
    ],
)
def test_decide(setting: str, given: ConfidentialFacts, platform: str, evidence: str) -> None:
    assert decide(setting, given) == Confidential(platform, evidence)


def test_decide_refuses_an_unknown_setting() -> None:
    with pytest.raises(ValueError, match="maybe"):
        decide("maybe", facts())


def test_read_facts(fake_root: FakeRoot) -> None:
    assert read_facts(fake_root.fs) == facts()
    fake_root.write("proc/cpuinfo", CPUINFO)
    (fake_root.root / "sys/devices/platform/sev-guest").mkdir(parents=True)
    fake_root.write("dev/sev-guest", "")
    found = read_facts(fake_root.fs)
    assert "tdx_guest" in found.cpu_flags
    assert found.sev_guest_platform_device and found.sev_guest_node and not found.tdx_guest_node
