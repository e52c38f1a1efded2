"""The bench's pure half: a process's /proc text turned into figures, and figures held against
targets. The host reads its own /proc and the guest's comes back through vm.exec; both parse
here, so a figure means the same on either side of the vsock."""

from __future__ import annotations

import json
import time
from typing import Any

MIB = 1 << 20


def elapsed(since: float) -> str:
    """The time since a time.monotonic() reading, as progress lines print it."""
    minutes, seconds = divmod(round(time.monotonic() - since), 60)
    return f"{minutes} min {seconds:02d} s"


def exact_memory(smaps_rollup: str) -> dict[str, int]:
    """VmRSS and RssAnon as smaps_rollup counts them, from the page tables, in bytes. Linux
    6.1 keeps /proc/PID/status's counters per thread and folds them in every 64 page faults,
    and one fault maps up to 16 file pages (fault-around): a process's status lagged its smaps
    by 1.1-3.9 MiB of VmRSS in the bench's runs, by how many faults its threads had not yet
    folded in; proc(5) says to read smaps for accurate figures. Rss less Anonymous is the
    file-backed (and shared memory) part. Full smaps text sums to the same."""
    fields = {"Rss": 0, "Anonymous": 0, "AnonHugePages": 0}
    for line in smaps_rollup.splitlines():
        key, _, rest = line.partition(":")
        if key in fields:
            fields[key] += int(rest.split()[0]) * 1024
    return {
        "VmRSS": fields["Rss"],
        "RssAnon": fields["Anonymous"],
        "RssFile": fields["Rss"] - fields["Anonymous"],
        "AnonHugePages": fields["AnonHugePages"],
    }


def status_memory(status: str) -> dict[str, int]:
    """VmRSS, RssAnon and Threads as /proc/PID/status says them (its memory counters lag:
    exact_memory)."""
    figures = {}
    for line in status.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            figures[key] = int(rest.split()[0]) * 1024
        elif key == "Threads":
            figures[key] = int(rest)
    return figures


def footprint(status: str, smaps_rollup: str) -> dict[str, int]:
    """VmRSS and RssAnon exact (exact_memory), Threads from /proc/PID/status, and Pss: what
    the process costs once shared library pages are split among their users."""
    exact = exact_memory(smaps_rollup)
    figures = {**status_memory(status), "VmRSS": exact["VmRSS"], "RssAnon": exact["RssAnon"]}
    for line in smaps_rollup.splitlines():
        if line.startswith("Pss:"):
            figures["Pss"] = int(line.split()[1]) * 1024
    return figures


def cpu_seconds(stat: str, ticks_per_second: int) -> float:
    """User plus system time from /proc/PID/stat; the fields are counted after the command
    name's closing parenthesis, since the name itself may hold spaces."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_second


def thread_kind(stat: str) -> str:
    """A thread's name from /proc/PID/task/TID/stat less its number (read_1 and read_2 are
    both "read"), so a pool's threads add up under one name."""
    return stat[stat.index("(") + 1 : stat.rindex(")")].rstrip("0123456789_-")


def cpu_by_thread_kind(stats: list[str], ticks_per_second: int) -> dict[str, float]:
    """CPU seconds so far by thread_kind, from each thread's stat."""
    seconds: dict[str, float] = {}
    for stat in stats:
        kind = thread_kind(stat)
        seconds[kind] = seconds.get(kind, 0.0) + cpu_seconds(stat, ticks_per_second)
    return seconds


def load_sample(
    status: str, smaps_rollup: str, stat: str, ticks_per_second: int
) -> dict[str, float]:
    """What the load bench samples of the agent: RssAnon, threads and CPU seconds so far."""
    figures = footprint(status, smaps_rollup)
    return {
        "rss_anon": figures["RssAnon"],
        "threads": figures["Threads"],
        "cpu_s": cpu_seconds(stat, ticks_per_second),
    }


def ratio_verdict(value: float, target: float) -> dict[str, Any]:
    return {"value": round(value, 3), "target": target, "met": value <= target}


def ratios(numerator: dict[str, int], denominator: dict[str, int]) -> dict[str, float]:
    """numerator / denominator for VmRSS and RssAnon, the two memory figures the targets name."""
    return {key: round(numerator[key] / denominator[key], 3) for key in ("VmRSS", "RssAnon")}


def mib_verdict(size: int, target_mib: float) -> dict[str, Any]:
    return {"mib": round(size / MIB, 1), "target_mib": target_mib, "met": size <= target_mib * MIB}


def tcp_ext_counters(netstat: str) -> dict[str, int]:
    """/proc/net/netstat's TcpExt counters by name (a header line, then a line of values)."""
    rows = [line.split()[1:] for line in netstat.splitlines() if line.startswith("TcpExt:")]
    names, values = rows[0], rows[1]
    return {name: int(value) for name, value in zip(names, values, strict=True)}


def listen_backlog(ss_listening: str) -> int:
    """The backlog of the listener `ss -Hltn` printed: a listening socket's Send-Q column."""
    return int(ss_listening.split()[2])


def audit_ms(log: str, method: str, since_unix: float) -> list[float]:
    """The duration_ms of the agent's audit lines for `method` logged since then (JSON lines;
    others, and lines not JSON, skipped)."""
    durations = []
    for line in log.splitlines():
        if '"audit"' not in line or method not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("method") == method and event.get("ts", 0) >= since_unix:
            durations.append(float(event["duration_ms"]))
    return durations
