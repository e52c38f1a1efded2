from guestagent.linux.keyed import parse_flat_keyed
from guestagent.linux.vmstat import VmStat, read_vmstat, vmstat_from
from tests.fakes.root import FakeRoot

VMSTAT = """\
nr_free_pages 73000
pgmajfault 321
pswpin 10
pswpout 20
workingset_refault_anon 5
workingset_refault_file 7
allocstall_dma 1
allocstall_dma32 2
allocstall_normal 3
allocstall_movable 4
compact_stall 6
oom_kill 1
"""


def test_the_counters_a_host_policy_needs() -> None:
    assert vmstat_from(parse_flat_keyed(VMSTAT)) == VmStat(
        pswpin=10,
        pswpout=20,
        pgmajfault=321,
        workingset_refault_anon=5,
        workingset_refault_file=7,
        oom_kill=1,
        allocstall=10,  # Summed over the zone types.
        compact_stall=6,
    )


def test_before_5_9_the_one_refault_counter_counts_as_file() -> None:
    stat = vmstat_from(parse_flat_keyed("workingset_refault 9\n"))
    assert (stat.workingset_refault_anon, stat.workingset_refault_file) == (0, 9)


def test_no_vmstat_file_is_none(fake_root: FakeRoot) -> None:
    assert read_vmstat(fake_root.fs) is None
    fake_root.write("proc/vmstat", VMSTAT)
    assert read_vmstat(fake_root.fs) == vmstat_from(parse_flat_keyed(VMSTAT))
