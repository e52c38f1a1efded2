import pytest

from guestagent.errors import FailedPrecondition, KernelFormat, NotFound
from guestagent.linux.cgroup.memory import parse_limit
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.linux.meminfo import parse_meminfo, read_report, system_memory_from
from guestagent.linux.psi import PressureLine, parse_pressure
from tests.fakes.root import MEMINFO, FakeRoot, make_fake_root


def test_meminfo_converts_kb_to_bytes_and_keeps_counts() -> None:
    values = parse_meminfo(MEMINFO)
    assert values["MemTotal"] == 498764 * 1024
    assert values["HugePages_Total"] == 0
    assert values["Hugepagesize"] == 2048 * 1024


def test_system_memory_names_missing_fields() -> None:
    with pytest.raises(FailedPrecondition, match="MemAvailable"):
        system_memory_from(parse_meminfo("MemTotal: 1 kB\nMemFree: 1 kB\n"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max\n", None),
        ("0\n", 0),
        ("536870912\n", 536870912),
    ],
)
def test_limit_values(text: str, expected: int | None) -> None:
    assert parse_limit(text) == expected


@pytest.mark.parametrize("text", ["", "-", "12k", "unlimited"])
def test_limit_rejects_garbage(text: str) -> None:
    with pytest.raises(KernelFormat):
        parse_limit(text)


def test_pressure_lines() -> None:
    pressure = parse_pressure(
        "some avg10=1.50 avg60=0.25 avg300=0.05 total=123456\n"
        "full avg10=0.50 avg60=0.10 avg300=0.01 total=65432\n"
    )
    assert pressure.some == PressureLine(1.5, 0.25, 0.05, 123456)
    assert pressure.full.total_us == 65432


@pytest.mark.parametrize(
    "text",
    [
        "some avg10=x avg60=0 avg300=0 total=0",
        "full avg10=0 avg60=0 avg300=0 total=0",
        "some 150000 1000000",
    ],
)
def test_pressure_rejects_malformed(text: str) -> None:
    with pytest.raises(KernelFormat):
        parse_pressure(text)


def test_report_reads_system_psi_and_cgroups(fake_root: FakeRoot) -> None:
    fake_root.add_cgroup("pod/ctr", current=5 << 20, max_="268435456")
    report = read_report(fake_root.fs, (cgroup_name("pod/ctr"),))
    assert report.system.mem_total == 498764 * 1024
    assert report.system.swap_total == 1048572 * 1024
    assert report.pressure is not None and report.pressure.some.avg10 == 1.5
    (cgroup,) = report.cgroups
    assert cgroup.current == 5 << 20
    assert cgroup.max == 268435456
    assert cgroup.high is None
    assert cgroup.swap is not None and cgroup.swap.current == 4096 and cgroup.swap.max is None
    assert (cgroup.events.high, cgroup.events.oom_kill) == (3, 1)
    assert (cgroup.anon, cgroup.file) == (1048576, 2097152)


def test_missing_features_are_absent_not_zero(tmp_path) -> None:  # type: ignore[no-untyped-def]
    fake = make_fake_root(tmp_path, psi=False)
    fake.add_cgroup("c", swap=False, psi=False)
    report = read_report(fake.fs, (cgroup_name("c"),))
    assert report.pressure is None
    assert report.cgroups[0].swap is None
    assert report.cgroups[0].pressure is None


def test_missing_cgroup_is_not_found_and_checked_before_reading(fake_root: FakeRoot) -> None:
    fake_root.add_cgroup("present")
    with pytest.raises(NotFound, match="'absent'"):
        read_report(fake_root.fs, (cgroup_name("present"), cgroup_name("absent")))


def test_cgroup_without_memory_controller(fake_root: FakeRoot) -> None:
    (fake_root.root / "sys/fs/cgroup/nomem").mkdir()
    with pytest.raises(FailedPrecondition, match="subtree_control"):
        read_report(fake_root.fs, (cgroup_name("nomem"),))
