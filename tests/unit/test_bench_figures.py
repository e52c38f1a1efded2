"""The bench's /proc parsing, the same for the host's processes and the guest's."""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench.figures import (
    audit_ms,
    cpu_by_thread_kind,
    cpu_seconds,
    exact_memory,
    footprint,
    listen_backlog,
    load_sample,
    mib_verdict,
    ratios,
    status_memory,
    tcp_ext_counters,
)

STATUS = """Name:\tpython3
VmPeak:\t  300000 kB
VmRSS:\t   30720 kB
RssAnon:\t   12288 kB
RssFile:\t   18432 kB
Threads:\t8
"""
SMAPS_ROLLUP = """55d0c0000000-7ffd00000000 ---p 00000000 00:00 0 [rollup]
Rss:               31744 kB
Pss:               20480 kB
Pss_Anon:          12800 kB
Anonymous:         12800 kB
"""
# The command name holds a space and a parenthesis: fields count from the last ")".
STAT = "412 (py (x) y) S 1 412 412 0 -1 4194560 5000 0 0 0 250 50 0 0 20 0 8 0 100 0 0"


def test_footprint_counts_memory_from_smaps_rollup_and_threads_from_status() -> None:
    # status lags the page tables (exact_memory): 30 MiB and 12 MiB there, 31 and 12.5 here.
    assert footprint(STATUS, SMAPS_ROLLUP) == {
        "VmRSS": 31 << 20,
        "RssAnon": 12800 << 10,
        "Threads": 8,
        "Pss": 20 << 20,
    }
    assert status_memory(STATUS) == {"VmRSS": 30 << 20, "RssAnon": 12 << 20, "Threads": 8}


def test_cpu_adds_up_by_thread_kind() -> None:
    stat = "9 (read_{}) S 1 1 1 0 -1 4194560 0 0 0 0 {} 1 0 0 20 0 1 0 5 0 0"
    stats = [stat.format(1, 100), stat.format(2, 50), STAT]
    assert cpu_by_thread_kind(stats, 100) == {"read": 1.52, "py (x) y": 3.0}


def test_cpu_seconds_are_utime_plus_stime() -> None:
    assert cpu_seconds(STAT, 100) == 3.0


def test_load_sample() -> None:
    assert load_sample(STATUS, SMAPS_ROLLUP, STAT, 100) == {
        "rss_anon": 12800 << 10,
        "threads": 8,
        "cpu_s": 3.0,
    }


@pytest.mark.parametrize(
    ("size", "mib", "met"),
    [(30 << 20, 30.0, True), ((30 << 20) + 4096, 30.0, False), (31 << 20, 31.0, False)],
)
def test_mib_verdict(size: int, mib: float, met: bool) -> None:
    assert mib_verdict(size, 30) == {"mib": mib, "target_mib": 30, "met": met}


def test_ratios_of_the_two_memory_figures() -> None:
    agent = {"VmRSS": 36 << 20, "RssAnon": 18 << 20, "Threads": 10}
    floor = {"VmRSS": 30 << 20, "RssAnon": 12 << 20, "Threads": 8}
    assert ratios(agent, floor) == {"VmRSS": 1.2, "RssAnon": 1.5}


def test_window_wakeups_count_threads_that_start_and_end_in_the_window() -> None:
    from tests.bench.footprint import window_wakeups

    before = {"1": 100, "2": 50, "3": 7}  # Thread 3 ends in the window, 4 starts in it.
    after = {"1": 110, "2": 50, "4": 5}
    assert window_wakeups(before, after) == 10 + 0 + 5 + 1


def test_wakeups_by_thread_name_add_up_to_the_window() -> None:
    from tests.bench.footprint import wakeups_by_thread, window_wakeups

    before = {"1": 100, "2": 50, "3": 7, "5": 20}  # 3 ends in the window, 4 starts in it.
    after = {"1": 110, "2": 53, "4": 5, "5": 22}
    names = {"1": "guestagent", "3": "read_1", "4": "read_2"}
    names |= {"2": "event_engine", "5": "event_engine"}
    got = wakeups_by_thread(before, after, names)
    assert got == {"event_engine": 3 + 2, "guestagent": 10, "read_1": 1, "read_2": 5}
    assert sum(got.values()) == window_wakeups(before, after)


def test_preemptions_are_the_involuntary_switches_of_the_threads_at_the_end() -> None:
    from tests.bench.footprint import preemptions

    assert preemptions({"1": 4, "2": 9}, {"1": 7, "3": 2}) == 3 + 2


def test_medians_of_wakeups_by_thread_count_a_missing_thread_as_none() -> None:
    from tests.bench.footprint import medians

    def run(ready_s: float, rss: int, by_thread: dict[str, float]) -> dict[str, Any]:
        return {"ready_s": ready_s, "phases": {"ready": {"RssAnon": rss, "by": by_thread}}}

    runs = [
        run(2.0, 10, {"idle-ager": 0.5, "read_1": 0.1}),
        run(3.0, 30, {"idle-ager": 0.7}),
        run(1.0, 20, {"idle-ager": 0.6, "read_1": 0.2}),
    ]
    assert medians(runs) == {
        "ready_s": 2.0,
        "ready": {"RssAnon": 20, "by": {"idle-ager": 0.6, "read_1": 0.1}},
    }


def test_medians_of_the_call_times_where_the_server_had_calls() -> None:
    from tests.bench.footprint import medians

    runs = [
        {"ready_s": 1.0, "first_call_s": 0.4, "again_s": 0.02, "phases": {}},
        {"ready_s": 1.0, "first_call_s": 0.2, "again_s": 0.03, "phases": {}},
        {"ready_s": 1.0, "first_call_s": 0.3, "again_s": 0.01, "phases": {}},
    ]
    assert medians(runs) == {"ready_s": 1.0, "first_call_s": 0.3, "again_s": 0.02}
    assert medians([{"ready_s": 1.0, "phases": {}}]) == {"ready_s": 1.0}  # The health server.


SMAPS = """5590a0000000-5590a0600000 rw-p 00000000 00:00 0                          [heap]
Size:               6144 kB
Anonymous:          4000 kB
7f0000000000-7f0000801000 rw-p 00000000 00:00 0
Size:               8196 kB
Anonymous:            64 kB
7f1000000000-7f1004000000 rw-p 00000000 00:00 0
Size:              65536 kB
Anonymous:          2000 kB
7f2000000000-7f2000100000 rw-p 00100000 fe:00 1234                       /opt/x/lib/libc.so.6
Size:               1024 kB
Anonymous:            24 kB
7f3000000000-7f3000100000 r--p 00000000 fe:00 1235                       /opt/x/lib/libm.so.6
Size:               1024 kB
Anonymous:             0 kB
"""


def test_anonymous_memory_by_mapping_kind() -> None:
    from tests.bench.footprint import anon_by_mapping

    assert anon_by_mapping(SMAPS) == {
        "heap": 4000,
        "anonymous mappings": 2000,
        "thread stacks": 64,
        "libc.so.6 (copy-on-write)": 24,
    }


def test_import_times_sum_by_package() -> None:
    from tests.bench.footprint import import_self_times

    log = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       100 |        100 |     guestagent.linux.fs\n"
        "import time:        50 |        150 |   guestagent.linux\n"
        "import time:        70 |         70 | json.decoder\n"
        "some other line\n"
    )
    assert import_self_times(log) == [("guestagent.linux", 150), ("json", 70)]


def test_exact_memory_from_smaps_rollup_and_from_full_smaps() -> None:
    rollup = (
        "55d0a0000000-7ffd00000000 ---p 00000000 00:00 0    [rollup]\n"
        "Rss:               36000 kB\nPss:               30000 kB\nAnonymous:         20000 kB\n"
        "AnonHugePages:      2048 kB\n"
    )
    assert exact_memory(rollup) == {
        "VmRSS": 36000 << 10,
        "RssAnon": 20000 << 10,
        "RssFile": 16000 << 10,
        "AnonHugePages": 2048 << 10,
    }
    smaps = "Rss: 100 kB\nAnonymous: 40 kB\nRss: 50 kB\nAnonymous: 0 kB\n"
    assert exact_memory(smaps) == {
        "VmRSS": 150 << 10,
        "RssAnon": 40 << 10,
        "RssFile": 110 << 10,
        "AnonHugePages": 0,
    }


DEBUGMALLOCSTATS = """Small block threshold = 512, in 32 size classes.
# arenas allocated total           =                  169
# arenas allocated current         =                    5
5 arenas * 1048576 bytes/arena     =            5,242,880

# bytes in allocated blocks        =            4,337,392
# bytes in available blocks        =              250,016
Total                              =            5,242,880

            1 free PyDictObjects * 48 bytes each =                   48
Total                              =                  48
"""

MALLOC_STATS = """Arena 0:
system bytes     =    5300224
in use bytes     =    3000000
Arena 1:
system bytes     =     135168
in use bytes     =       2224
Total (incl. mmap):
system bytes     =    5570560
in use bytes     =    3137392
max mmap regions =          2
max mmap bytes   =     135168
"""


def test_allocator_figures() -> None:
    from tests.bench.footprint import glibc_malloc_figures, pymalloc_figures

    assert pymalloc_figures(DEBUGMALLOCSTATS) == {
        "arenas": 5,
        "allocated_bytes": 4_337_392,
        "total_bytes": 5_242_880,
        "unused_bytes": 5_242_880 - 4_337_392,
    }
    assert glibc_malloc_figures(MALLOC_STATS) == {
        "arenas": 2,
        "system_bytes": 5_570_560,
        "in_use_bytes": 3_137_392,
        "max_mmap_bytes": 135_168,
    }


def test_verdicts_against_the_contract_server_only_once_the_agent_holds_the_contract() -> None:
    from tests.bench.footprint import verdicts

    def phase(rss_anon: int, vm_rss: int) -> dict[str, Any]:
        return {
            "RssAnon": rss_anon,
            "VmRSS": vm_rss,
            "Pss": rss_anon,
            "Threads": 8,
            "wakeups_per_s": 8.0,
            "wakeups_per_s_by_thread": {},
            "preempted_per_s": 0.0,
        }

    def server(ready: int, calls: int) -> dict[str, Any]:
        return {
            "ready_s": 2.0,
            "ready": phase(ready, 3 * ready),
            "after_calls": phase(calls, 3 * calls),
        }

    agent, floor, contract = server(1250, 1500), server(1000, 1000), server(1300, 1250)
    targets = verdicts(agent, floor, {"ready_s": 2.0}, contract)
    assert targets["after_calls"]["rss_anon_vs_floor"] == {
        "value": 1.5,
        "target": 1.25,
        "met": False,
    }
    assert targets["after_calls"]["vs_contract_server"] == {
        "rss_anon": {"value": 1.2, "target": 1.25, "met": True},
        "vm_rss": {"value": 1.2, "target": 1.1, "met": False},
        "pss": 1.2,
    }
    # When ready the agent has not loaded its contract; the contract server has.
    assert "vs_contract_server" not in targets["ready"]
    assert "vs_contract_server" not in verdicts(agent, floor, {"ready_s": 2.0})["after_calls"]


NETSTAT = """TcpExt: SyncookiesSent ListenOverflows ListenDrops
TcpExt: 0 2073 2074
IpExt: InNoRoutes InTruncatedPkts
IpExt: 0 0
"""


def test_tcp_ext_counters_pair_names_with_values() -> None:
    counters = tcp_ext_counters(NETSTAT)
    assert (counters["ListenOverflows"], counters["ListenDrops"]) == (2073, 2074)
    assert "InNoRoutes" not in counters


def test_listen_backlog_is_a_listeners_send_q() -> None:
    # QEMU's forwarded port, as `ss -Hltn` printed it: libslirp listens with a backlog of 1.
    assert listen_backlog("LISTEN 0      1          127.0.0.1:41003      0.0.0.0:*\n") == 1


def test_audit_ms_takes_the_methods_lines_since_then() -> None:
    log = "\n".join(
        [
            '{"ts": 99.0, "event": "audit", "method": "SetMemoryLimits", "duration_ms": 1.0}',
            '{"ts": 101.0, "event": "audit", "method": "SetMemoryLimits", "duration_ms": 2.5}',
            '{"ts": 102.0, "event": "audit", "method": "EnableSwap", "duration_ms": 9.0}',
            "guestagent-init: a line that is not JSON, with audit and SetMemoryLimits in it",
            '{"ts": 103.0, "event": "audit", "method": "SetMemoryLimits", "duration_ms": 4.0}',
        ]
    )
    assert audit_ms(log, "SetMemoryLimits", 100.0) == [2.5, 4.0]
