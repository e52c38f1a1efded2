"""Where a GetMemoryInfo's CPU goes, by stage, in the process that runs this (issue 56).

Runs as a script beside an agent (in the guest, over its real kernel files; on the host, over
a fake root), with the agent's own code: it times, on one thread, the stages the servicer runs
for a call, interleaved so the machine's noise falls on each alike:

- system files: `read_report` with no cgroup (meminfo, vmstat, PSI, the hot-plug section);
- cgroup files: `read_report` with the call's cgroups, less the system files;
- give-back sources: `read_giveback_sources` (buddyinfo, zoneinfo, the cgroups' protections);
- building the report: `Reporter.report` less all three (the give-back figures from the idle
  ages, the reclaimer's status, the state store);
- protobuf: `wire.report_pb` and `SerializeToString`, what grpc sends.

The rest of a call, gRPC (HTTP/2, the aio server's scheduling, the request's decode), is the
agent's CPU per call in a serial loop (measured by the caller from /proc/PID/stat) less these.
Prints one JSON object: the median and p90 CPU of each stage in microseconds.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import time
from collections.abc import Callable

from guestagent.agent import wire
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.linux.confidential import decide, read_facts
from guestagent.linux.delayacct import DelayStallMeter
from guestagent.linux.giveback_sources import read_giveback_sources
from guestagent.linux.kernel import Kernel
from guestagent.linux.memblocks import HotplugReportCache
from guestagent.linux.meminfo import read_report
from guestagent.ops.idle import IdleAger
from guestagent.ops.info import InfoSpec, Reporter

WARMUP = 20


def cpu_us(call: Callable[[], object]) -> float:
    started = time.thread_time_ns()
    call()
    return (time.thread_time_ns() - started) / 1000


def quantile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 1)


def afresh(reporter: Reporter, spec: InfoSpec) -> object:
    """A report read afresh. Since issue 56 reports share readings taken since `fresh_from`
    (none is ever that fresh at +inf); the tree before shared none."""
    if "fresh_from" in inspect.signature(Reporter.report).parameters:
        return reporter.report(spec, False, math.inf)
    return reporter.report(spec)


def stage_costs(root: str, cgroups: tuple[str, ...], calls: int) -> dict[str, object]:
    kernel = Kernel(root)
    stall = DelayStallMeter(kernel) if kernel.is_real else None
    # The agent's ager keeps the books a report's idle figures come from: two agings here give
    # this process books of its own (the multi-gen LRU's aging is the guest's either way).
    ager = IdleAger(kernel)
    for _ in range(2):
        ager.cycle()
    reporter = Reporter(
        kernel,
        confidential=decide("auto", read_facts(kernel)),
        ager=ager,
        stall=stall,
    )
    names = tuple(cgroup_name(name) for name in cgroups)
    spec = InfoSpec(names)
    hotplug = HotplugReportCache()
    report = reporter.report(spec)
    timed = {
        "system": lambda: read_report(kernel, (), hotplug, stall),
        "read": lambda: read_report(kernel, names, hotplug, stall),
        "sources": lambda: read_giveback_sources(kernel, report.report.system, None),
        "report": lambda: afresh(reporter, spec),
        "protobuf": lambda: wire.report_pb(report).SerializeToString(),
    }
    samples: dict[str, list[float]] = {name: [] for name in timed}
    for n in range(WARMUP + calls):
        for name, call in timed.items():
            took = cpu_us(call)
            if n >= WARMUP:
                samples[name].append(took)
    rows = list(zip(*(samples[name] for name in timed), strict=True))
    stages = {
        "system_files": samples["system"],
        "cgroup_files": [read - system for system, read, *_ in rows],
        "giveback_sources": samples["sources"],
        "building_the_report": [whole - read - sources for _, read, sources, whole, _ in rows],
        "protobuf": samples["protobuf"],
    }
    return {
        "calls": calls,
        "cgroups": list(cgroups),
        "report_bytes": len(wire.report_pb(report).SerializeToString()),
        **{
            name: {"cpu_us_p50": quantile(values, 0.5), "cpu_us_p90": quantile(values, 0.9)}
            for name, values in stages.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default="/")
    parser.add_argument("--cgroups", default="", help="comma list, as a caller names them")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    cgroups = tuple(name for name in args.cgroups.split(",") if name)
    print(json.dumps(stage_costs(args.root, cgroups, args.calls)))


if __name__ == "__main__":
    main()
