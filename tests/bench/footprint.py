"""The agent's footprint in a guest, on its own runtime, against the grpcio floor started the
same way in the same boot: RssAnon, VmRSS, Pss, threads and idle wakeups a second, when ready,
after a burst of mixed calls and after a watch stream, each read at the end of an idle window;
and the time to serving beside a health-only server's. The three servers take turns, round
after round, and each figure is the median of the rounds. All three start with transparent
huge pages refused (the probe sets it and they inherit it), as the agent refuses them itself.

`python -m tests.bench.run --sections footprint --out FILE.json` runs it alone;
--footprint-idle-seconds and --footprint-watch-seconds shorten it (defaults: the footprint
issue's 60 s and 10 minutes).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guestagent.build.runtime import INTERPRETER_FLAGS
from guestagent.host.sizing.boot import VMConfig
from guestagent.vm.qemu import GuestCommandError, GuestVM
from tests.bench.figures import (
    elapsed,
    exact_memory,
    footprint,
    ratio_verdict,
    status_memory,
)
from tests.bench.floor_server import METHOD as FLOOR_METHOD
from tests.bench.floor_server import STREAM_METHOD as FLOOR_STREAM
from tests.bench.runtime import SITE

ROUNDS = 3
CALLS = 500
IDLE_SECONDS = 60.0
WATCH_SECONDS = 600.0
# The footprint issue's targets.
RSS_ANON_TARGET = 1.25
VM_RSS_TARGET = 1.10
WAKEUPS_ABOVE_FLOOR = 1.0
READY_TARGET = 1.10

# The agent's own command, as the image's init and unit start it, on a socket of its own and
# left in the bench's cgroup (the boot's agent holds /guestagent).
AGENT_COMMAND = ("/opt/guestagent/bin/guestagent", "serve", "--no-self-cgroup", "--listen")
# The yardsticks start as the agent's command does: the tree's interpreter, its flags in the
# shebang, the tree's site-packages, LC_ALL=C (the probe sets it for all three).
INTERPRETER = "/opt/guestagent/bin/python3.11"
INTERPRETER_LINE = f"#!{INTERPRETER} {INTERPRETER_FLAGS}"
HEALTH_CHECK = ("/grpc.health.v1.Health/Check", "", "0801")  # "" is the whole server; SERVING.
AGENT_METHODS = ("GetMemoryInfo", "ListSwaps", "GetGuestOverhead", "GetReclaimStatus")
# Empty requests: the whole guest, every swap area, every cgroup the reclaimer knows.
AGENT_CALLS = (
    *((f"/guestagent.v1.MemoryAgent/{name}", "") for name in AGENT_METHODS),
    HEALTH_CHECK[:2],
)
PHASES = ("ready", "after_calls", "after_watch")
# The burst's first call and the same method's next, in seconds (the probe's).
CALL_TIMES = ("first_call_s", "again_s")


@dataclass(frozen=True)
class Server:
    """One server the probe runs: how to start it, the call that says it serves, the calls of
    the burst and the stream of the watch phase (raw bytes, so the probe needs no stubs)."""

    label: str
    command: tuple[str, ...]
    ready: tuple[str, str, str]  # method, request hex, the reply that means serving
    calls: tuple[tuple[str, str], ...] = ()  # method, request hex
    stream: tuple[str, str] | None = None


# WatchMemory's empty request: the whole guest every second (its default interval).
WATCH = ("/guestagent.v1.MemoryAgent/WatchMemory", "")
AGENT = Server("agent", AGENT_COMMAND, HEALTH_CHECK, AGENT_CALLS, WATCH)
FLOOR = Server(
    "floor",
    ("/run/bench-floor",),
    (FLOOR_METHOD, "78", "78"),
    ((FLOOR_METHOD, "78"),),
    (FLOOR_STREAM, "78"),
)
HEALTH = Server("health", ("/run/bench-health",), HEALTH_CHECK)
# The floor serving the agent's contract with empty replies (contract_server.py): the same
# calls and stream as the agent's.
CONTRACT = Server("contract", ("/run/bench-contract",), HEALTH_CHECK, AGENT_CALLS, WATCH)
SERVERS = (AGENT, FLOOR, CONTRACT, HEALTH)
# The phases in which the contract server and the agent hold the same contract: when ready
# the agent has not loaded it yet (agent/first_call.py), so only these are compared.
CONTRACT_PHASES = ("after_calls", "after_watch")

# Runs in the guest on the tree's interpreter: start the server, time it to serving, then for
# each phase (the burst and the stream only where the server has them) sample it at the end of
# an idle window with no connection open. Prints one JSON line.
PROBE = r"""
import json, os, subprocess, sys, time
import grpc
spec = json.loads(sys.argv[1])
BACKOFF = [(f"grpc.{k}_reconnect_backoff_ms", 20) for k in ("initial", "min", "max")]

def switches(pid, names):
    by_thread, preempted = {}, {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as status:
                counts = {l.split(":")[0]: int(l.split()[1]) for l in status if "ctxt_sw" in l}
            with open(f"/proc/{pid}/task/{tid}/comm") as comm:
                names[tid] = comm.read().strip()
        except FileNotFoundError:
            continue  # A thread that ended in between.
        by_thread[tid] = sum(counts.values())
        preempted[tid] = counts["nonvoluntary_ctxt_switches"]
    return by_thread, preempted

def idle_sample(pid, seconds):
    names = {}
    (before, preempted_before), started = switches(pid, names), time.monotonic()
    time.sleep(seconds)
    (after, preempted_after), elapsed = switches(pid, names), time.monotonic() - started
    read = lambda name: open(f"/proc/{pid}/{name}").read()
    return {"status": read("status"), "smaps_rollup": read("smaps_rollup"),
            "switches": [before, after], "preempted": [preempted_before, preempted_after],
            "names": names, "seconds": elapsed}

# PR_SET_THP_DISABLE, inherited by the server: the agent refuses transparent huge pages at
# start, so each yardstick starts refusing them too. Otherwise a yardstick's first touch of a
# 2 MiB-aligned stretch can take a whole huge page and the ratios ride on which did.
import ctypes
ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0)
method, request, reply = spec["ready"]
log = open(spec["log"], "w")
started = time.monotonic()
server = subprocess.Popen(spec["command"] + [spec["target"]], stdout=log, stderr=log,
                          env={**os.environ, "LC_ALL": "C"})
with grpc.insecure_channel(spec["target"], options=BACKOFF) as channel:
    call = channel.unary_unary(method)
    while True:
        try:
            if call(bytes.fromhex(request), timeout=5, wait_for_ready=True) == bytes.fromhex(reply):
                break
        except grpc.RpcError as error:
            if server.poll() is not None or time.monotonic() - started > 600:
                server.kill()
                sys.exit(f"{spec['command']} did not serve: {error.code()}, exit {server.poll()}")
        time.sleep(0.02)
result = {"ready_s": round(time.monotonic() - started, 3)}
samples = result["samples"] = {"ready": idle_sample(server.pid, spec["idle_s"])}
if spec["calls"]:
    with grpc.insecure_channel(spec["target"]) as channel:
        calls = [(channel.unary_unary(m), bytes.fromhex(r)) for m, r in spec["calls"]]
        for i in range(spec["calls_n"]):
            call, request = calls[i % len(calls)]
            began = time.monotonic()
            call(request, timeout=120)
            # The burst's first call, and the same method once more: the agent builds its
            # service at its first call (agent/first_call.py).
            if i in (0, len(calls)):
                result["first_call_s" if i == 0 else "again_s"] = round(time.monotonic() - began, 3)
    samples["after_calls"] = idle_sample(server.pid, spec["idle_s"])
if spec["stream"]:
    messages, ends = 0, time.monotonic() + spec["watch_s"]
    with grpc.insecure_channel(spec["target"]) as channel:
        method, request = spec["stream"]
        stream = channel.unary_stream(method)(bytes.fromhex(request))
        for _ in stream:
            messages += 1
            if time.monotonic() >= ends:
                break
        stream.cancel()
    result["stream_messages"] = messages
    samples["after_watch"] = idle_sample(server.pid, spec["idle_s"])
server.terminate()
server.wait(60)
print(json.dumps(result))
"""


def pause_image_agent(vm: GuestVM) -> None:
    """SIGSTOP the image's own agent for the section: it ages the multi-gen LRU every 10 s,
    and each pass's 100 ms of CPU preempted whichever server was being sampled (in one guest,
    5 involuntary switches a pass for the idle-ager thread; 2026-12-05). Stopped, not
    killed: the image's init would start another."""
    vm.exec("pkill -STOP -x guestagent")
    states = vm.exec("for p in $(pgrep -x guestagent); do cut -d' ' -f3 /proc/$p/stat; done")
    if set(states.stdout.split()) != {"T"}:
        raise RuntimeError(f"the image's agent did not stop: states {states.stdout.split()}")


def install_yardsticks(vm: GuestVM) -> None:
    """The floor, the contract server and the health server as commands of the guest, started
    as the agent's is."""
    bench = Path(__file__).parent
    for name, script in (
        ("floor", "floor_server.py"),
        ("contract", "contract_server.py"),
        ("health", "baseline_server.py"),
    ):
        text = f"{INTERPRETER_LINE}\nimport sys\nsys.path.append({SITE!r})\n"
        text += (bench / script).read_text()
        vm.exec(f"cat > /run/bench-{name} && chmod 755 /run/bench-{name}", stdin=text)
    vm.exec("cat > /run/footprint-probe.py", stdin=PROBE)


def probe(vm: GuestVM, server: Server, idle_s: float, watch_s: float, calls: int) -> Any:
    log = f"/run/bench-{server.label}.log"
    spec = {
        "command": list(server.command),
        "target": f"unix:///run/bench-{server.label}.sock",
        "log": log,
        "ready": list(server.ready),
        "calls": [list(c) for c in server.calls],
        "calls_n": calls,
        "stream": list(server.stream) if server.stream else None,
        "idle_s": idle_s,
        "watch_s": watch_s,
    }
    argv = ["/opt/guestagent/bin/python3", "/run/footprint-probe.py", json.dumps(spec)]
    try:
        output = vm.exec(argv, timeout=3 * idle_s + watch_s + 1800).stdout
    except GuestCommandError as error:
        text = vm.exec(["cat", log], check=False).stdout
        raise GuestCommandError(f"{error}\n{server.label}'s output:\n{text}") from error
    return json.loads(output)


def window_wakeups(before: dict[str, int], after: dict[str, int]) -> int:
    """Context switches over a window from each thread's counts at its ends: a thread's own
    when it lived throughout, all of a thread's that started in it, and one (its last wakeup)
    for a thread that ended in it, whose counts end with it."""
    lived = sum(count - before.get(tid, 0) for tid, count in after.items())
    return lived + sum(1 for tid in before if tid not in after)


def wakeups_by_thread(
    before: dict[str, int], after: dict[str, int], names: dict[str, str]
) -> dict[str, int]:
    """window_wakeups by thread name (/proc's comm: grpc names its threads, the agent its own;
    a thread Python started and never named carries the process's), so the bench says whose
    wakeups the agent's figure above the floor's is."""
    by_name: dict[str, int] = {}
    for tid in before.keys() | after.keys():
        one = [{tid: counts[tid]} if tid in counts else {} for counts in (before, after)]
        name = names.get(tid, "?")
        by_name[name] = by_name.get(name, 0) + window_wakeups(*one)
    return dict(sorted(by_name.items()))


def preemptions(before: dict[str, int], after: dict[str, int]) -> int:
    """The involuntary switches over a window (of the threads alive at its end): a thread
    taken off a CPU while it ran, not woken, so a wakeup figure over-counts by these (under
    TCG mostly the idle ager's aging write, which runs long)."""
    return sum(count - before.get(tid, 0) for tid, count in after.items())


def sample_figures(sample: dict[str, Any]) -> dict[str, Any]:
    """One idle window's end: the memory figures (VmRSS and RssAnon exact, status's beside
    them) and the wakeups a second over the window."""
    status = status_memory(sample["status"])
    figures: dict[str, Any] = {
        **footprint(sample["status"], sample["smaps_rollup"]),
        "VmRSS_status": status["VmRSS"],
        "RssAnon_status": status["RssAnon"],
        **exact_memory(sample["smaps_rollup"]),
    }
    if sample["seconds"] >= 1:  # The health server's is no window: its ready time is all.
        before, after = sample["switches"]
        figures["wakeups_per_s"] = round(window_wakeups(before, after) / sample["seconds"], 2)
        by_thread = wakeups_by_thread(before, after, sample["names"])
        figures["wakeups_per_s_by_thread"] = {
            name: round(count / sample["seconds"], 2) for name, count in by_thread.items()
        }
        figures["preempted_per_s"] = round(preemptions(*sample["preempted"]) / sample["seconds"], 2)
    return figures


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure of each phase, and the ready time, as the median of the rounds."""
    result: dict[str, Any] = {"ready_s": statistics.median(r["ready_s"] for r in runs)}
    for key in CALL_TIMES:
        if key in runs[0]:
            result[key] = statistics.median(r[key] for r in runs)
    for phase in runs[0]["phases"]:
        figures = [r["phases"][phase] for r in runs]
        result[phase] = {
            key: (
                by_name_medians([f[key] for f in figures])
                if isinstance(value, dict)
                else statistics.median(f[key] for f in figures)
            )
            for key, value in figures[0].items()
        }
    return result


def by_name_medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each name's median over the rounds, 0 in a round where it had no thread."""
    names = sorted(set().union(*rounds))
    return {name: statistics.median(r.get(name, 0) for r in rounds) for name in names}


def verdicts(
    agent: dict[str, Any],
    floor: dict[str, Any],
    health: dict[str, Any],
    contract: dict[str, Any] | None = None,
) -> Any:
    """The issue's targets, phase by phase, each met or not; and, after the calls and the
    stream, the same memory targets against the contract server (what the agent holds beyond
    serving its contract in protobuf)."""
    targets: dict[str, Any] = {
        "ready_vs_health_server": ratio_verdict(agent["ready_s"] / health["ready_s"], READY_TARGET)
    }
    for phase in PHASES:
        if phase not in agent or phase not in floor:
            continue
        mine, base = agent[phase], floor[phase]
        wakeups_limit = round(base["wakeups_per_s"] + WAKEUPS_ABOVE_FLOOR, 2)
        targets[phase] = {
            "rss_anon_vs_floor": ratio_verdict(mine["RssAnon"] / base["RssAnon"], RSS_ANON_TARGET),
            "vm_rss_vs_floor": ratio_verdict(mine["VmRSS"] / base["VmRSS"], VM_RSS_TARGET),
            "pss_vs_floor": round(mine["Pss"] / base["Pss"], 3),
            "threads": {"agent": mine["Threads"], "floor": base["Threads"]},
            "wakeups_per_s": ratio_verdict(mine["wakeups_per_s"], wakeups_limit),
            "wakeups_per_s_by_thread": {
                "agent": mine["wakeups_per_s_by_thread"],
                "floor": base["wakeups_per_s_by_thread"],
            },
            "preempted_per_s": {"agent": mine["preempted_per_s"], "floor": base["preempted_per_s"]},
        }
        if contract is not None and phase in CONTRACT_PHASES and phase in contract:
            served = contract[phase]
            targets[phase]["vs_contract_server"] = {
                "rss_anon": ratio_verdict(mine["RssAnon"] / served["RssAnon"], RSS_ANON_TARGET),
                "vm_rss": ratio_verdict(mine["VmRSS"] / served["VmRSS"], VM_RSS_TARGET),
                "pss": round(mine["Pss"] / served["Pss"], 3),
            }
    return targets


def measure_footprint(
    idle_s: float = IDLE_SECONDS,
    watch_s: float = WATCH_SECONDS,
    rounds: int = ROUNDS,
    calls: int = CALLS,
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {s.label: [] for s in SERVERS}
    started = time.monotonic()
    with GuestVM(VMConfig(memory_mib=1024)) as vm:
        pause_image_agent(vm)
        install_yardsticks(vm)
        for round_number in range(1, rounds + 1):
            for server in SERVERS:
                got = probe(vm, server, idle_s if server is not HEALTH else 0, watch_s, calls)
                phases = {name: sample_figures(s) for name, s in got["samples"].items()}
                times = {key: got[key] for key in CALL_TIMES if key in got}
                runs[server.label].append({"ready_s": got["ready_s"], **times, "phases": phases})
                # At full length a round is about half an hour: say where the section is.
                line = f"round {round_number}/{rounds}, {server.label} ready in {got['ready_s']} s"
                print(f"bench: footprint {line} (section at {elapsed(started)})", file=sys.stderr)
        where = breakdown(vm, idle_s)
    median = {label: medians(r) for label, r in runs.items()}
    return {
        "breakdown": where,
        "lengths": {"idle_s": idle_s, "watch_s": watch_s, "rounds": rounds, "calls": calls},
        "runs": runs,
        "medians": median,
        "targets": verdicts(median["agent"], median["floor"], median["health"], median["contract"]),
    }


# Runs in the guest on the tree's interpreter with the agent's flags: what each step of the
# agent's imports adds to RssAnon, the grpcio floor's own imports first.
STAGES = r"""
import ctypes, gc, importlib, json, sys
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # No huge pages, as the agent: else 2 MiB steps.
sys.modules["ssl"] = None
sys.path.append(sys.argv[1])
DEFERRAL = "guestagent.load_on_use"  # Installed as entry() does, before protobuf loads.
STAGES = [
    ("interpreter", []),
    ("entry()'s load_on_use", [DEFERRAL]),
    ("floor: asyncio, grpc.aio", ["asyncio", "grpc", "grpc.aio"]),
    ("guestagent.linux", ["guestagent.linux.fs", "guestagent.linux.meminfo"]),
    ("guestagent.ops", ["guestagent.ops.hotplug", "guestagent.ops.idle"]),
    ("guestagent.agent", ["guestagent.agent.daemon"]),
]
# Not at start: what the agent imports when a call first needs it (or, for swap and the
# reclaimer, at start when an earlier agent left them state). The contract's service loads
# protobuf, its descriptors, the wire conversions, the reports and the operations (limits'
# too, unless a dead agent left a journal) (agent/first_call.py); the health service needs
# none of it (agent/health.py).
ON_FIRST_CALL = [
    ("protobuf runtime", ["google.protobuf.descriptor_pool", "google.protobuf.message"]),
    ("guestagent.v1 descriptors", ["guestagent.v1.agent_pb2", "guestagent.v1.agent_pb2_grpc"]),
    ("the contract's code", ["guestagent.agent.rpc"]),
    ("grpc_reflection", ["grpc_reflection.v1alpha.reflection"]),
    ("swap", ["guestagent.ops.swap"]),
    ("reclaimer", ["guestagent.ops.workingset.reclaimer"]),
]
def rss_anon():
    rollup = open("/proc/self/smaps_rollup")  # Exact, where status's counters lag.
    return next(int(l.split()[1]) for l in rollup if l.startswith("Anonymous:"))
out, last = [], rss_anon()
for name, modules in STAGES:
    count = len(sys.modules)
    for module in modules:
        importlib.import_module(module)
    if DEFERRAL in modules:
        sys.modules[DEFERRAL].load_on_use()
    gc.collect()
    now = rss_anon()
    out.append({"stage": name, "rss_anon_kib": now - last, "modules": len(sys.modules) - count})
    last = now
first_call, at_start = [], last
for name, modules in ON_FIRST_CALL:
    for module in modules:
        importlib.import_module(module)
    gc.collect()
    now = rss_anon()
    first_call.append({"stage": name, "rss_anon_kib": now - last})
    last = now
from google.protobuf.internal import api_implementation
print(json.dumps({"stages": out, "total_kib": at_start, "protobuf": api_implementation.Type(),
                  "on_first_call": first_call}))
"""

# Runs in the guest: the agent started as the probe starts it (or under the interpreter with
# extra -X options), serving, then idle for a window: its threads with their names and
# wakeups, its mappings' resident anonymous memory by kind, and whatever the -X options wrote.
SNAPSHOT = r"""
import json, os, signal, subprocess, sys, time
import grpc
command, target, idle_s = json.loads(sys.argv[1]), sys.argv[2], float(sys.argv[3])
log = open("/run/bench-snapshot.log", "w")
agent = subprocess.Popen(command + [target], stdout=log, stderr=log,
                         env={**os.environ, "LC_ALL": "C"})
with grpc.insecure_channel(target) as channel:
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    while check(b"", timeout=600, wait_for_ready=True) != b"\x08\x01":
        time.sleep(0.05)
pid = agent.pid
def threads():
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        switches = sum(int(l.split()[1]) for l in open(f"{base}/status") if "ctxt_switches" in l)
        out[tid] = [open(f"{base}/comm").read().strip(), switches]
    return out
before = threads()
time.sleep(idle_s)
after = threads()
smaps = open(f"/proc/{pid}/smaps").read()
status = open(f"/proc/{pid}/status").read()
if "/run/bench-traced.py" in command:
    agent.send_signal(signal.SIGUSR1)  # The wrapper's dump (SIGUSR1 would end a plain agent).
    time.sleep(5)
agent.terminate()
agent.wait(60)
print(json.dumps({"threads": [[name, n - before.get(tid, [name, 0])[1]]
                              for tid, (name, n) in sorted(after.items())],
                  "idle_s": idle_s, "smaps": smaps, "status": status}))
"""

# The agent, at SIGUSR1: under tracemalloc the Python heap traced so far by file; otherwise
# the two allocators' own counts (pymalloc's and glibc's), all to stderr.
TRACED_AGENT = r"""
import collections, ctypes, json, signal, sys, tracemalloc
sys.path.append(sys.argv.pop(1))
def dump(signum, frame):
    if not tracemalloc.is_tracing():
        sys._debugmallocstats()
        ctypes.CDLL(None).malloc_stats()
        return
    by_file = collections.Counter()
    for stat in tracemalloc.take_snapshot().statistics("filename"):
        by_file[stat.traceback[0].filename] += stat.size
    print("TRACEMALLOC " + json.dumps(by_file.most_common(40)), file=sys.stderr, flush=True)
signal.signal(signal.SIGUSR1, dump)
from guestagent.agent.entry import entry
sys.argv[0] = "guestagent"
sys.exit(entry())
"""
TRACED_COMMAND = [INTERPRETER, INTERPRETER_FLAGS]


def anon_by_mapping(smaps: str) -> dict[str, int]:
    """Resident anonymous memory (KiB) by where it sits: the brk heap, thread stacks (an 8 MiB
    mapping), other anonymous mappings (malloc arenas, grpc's and Python's own mmaps), and the
    private dirty pages of each shared object."""
    kinds: dict[str, int] = {}
    name, size = "", 0
    for line in smaps.splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            size, name = (end - start) >> 10, fields[5] if len(fields) > 5 else ""
        elif fields[0] == "Anonymous:" and int(fields[1]):
            if name == "[heap]":
                kind = "heap"
            elif not name and size in (8192, 8196):
                kind = "thread stacks"
            elif not name:
                kind = "anonymous mappings"
            else:
                kind = f"{name.rsplit('/', 1)[-1]} (copy-on-write)"
            kinds[kind] = kinds.get(kind, 0) + int(fields[1])
    return dict(sorted(kinds.items(), key=lambda item: -item[1]))


def pymalloc_figures(stats: str) -> dict[str, int]:
    """sys._debugmallocstats()'s totals: pymalloc's 1 MiB arenas (mmap'd, freed only when
    every block in them is), the bytes in live objects, and the rest of the arenas."""
    figures: dict[str, int] = {}
    for line in stats.splitlines():
        name, _, value = line.partition("=")
        name = name.strip()
        if name == "# arenas allocated current":
            figures["arenas"] = int(value.replace(",", ""))
        elif name == "# bytes in allocated blocks":
            figures["allocated_bytes"] = int(value.replace(",", ""))
        elif name == "Total" and "arenas" in figures and "total_bytes" not in figures:
            figures["total_bytes"] = int(value.replace(",", ""))
    if "total_bytes" in figures and "allocated_bytes" in figures:
        figures["unused_bytes"] = figures["total_bytes"] - figures["allocated_bytes"]
    return figures


def glibc_malloc_figures(stats: str) -> dict[str, int]:
    """malloc_stats()'s arenas and totals: what glibc holds from the kernel (heap, arena heaps
    and mmap'd chunks) and what of it is in use."""
    figures = {"arenas": 0}
    in_total = False
    for line in stats.splitlines():
        name, _, value = line.partition("=")
        name = name.strip()
        if line.startswith("Arena "):
            figures["arenas"] += 1
        elif line.startswith("Total (incl. mmap)"):
            in_total = True
        elif in_total and name in ("system bytes", "in use bytes", "max mmap bytes"):
            figures[name.replace(" ", "_")] = int(value)
    return figures


def import_self_times(importtime: str, top: int = 15) -> list[tuple[str, int]]:
    """-X importtime's lines summed by top-level package (self time, microseconds)."""
    totals: dict[str, int] = {}
    for line in importtime.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = line.removeprefix("import time:").split("|")
        parts = name.strip().split(".")
        key = ".".join(parts[:2]) if parts[0] in ("guestagent", "google", "grpc") else parts[0]
        totals[key] = totals.get(key, 0) + int(self_us)
    return sorted(totals.items(), key=lambda item: -item[1])[:top]


def breakdown(vm: GuestVM, idle_s: float) -> dict[str, Any]:
    """Where the agent's memory and wakeups go beyond the floor's, in this guest."""
    vm.exec("cat > /run/bench-stages.py", stdin=STAGES)
    vm.exec("cat > /run/bench-snapshot.py", stdin=SNAPSHOT)
    vm.exec("cat > /run/bench-traced.py", stdin=TRACED_AGENT)
    python = [INTERPRETER, INTERPRETER_FLAGS]
    stages = json.loads(vm.exec([*python, "/run/bench-stages.py", SITE], timeout=600).stdout)

    def snapshot(command: list[str]) -> dict[str, Any]:
        argv = ["/opt/guestagent/bin/python3", "/run/bench-snapshot.py", json.dumps(command)]
        result = vm.exec([*argv, "unix:///run/bench-snapshot.sock", str(idle_s)], timeout=1200)
        got: dict[str, Any] = json.loads(result.stdout)
        got["log"] = vm.exec(["cat", "/run/bench-snapshot.log"]).stdout
        return got

    plain = snapshot(list(AGENT_COMMAND))
    serve = list(AGENT_COMMAND[1:])
    timed = snapshot([*TRACED_COMMAND, "-X", "importtime", "/run/bench-traced.py", SITE, *serve])
    traced = snapshot([*TRACED_COMMAND, "-X", "tracemalloc", "/run/bench-traced.py", SITE, *serve])
    dump = next(
        line.removeprefix("TRACEMALLOC ")
        for line in traced["log"].splitlines()
        if line.startswith("TRACEMALLOC ")
    )
    # The import-time run is the agent without tracemalloc; its SIGUSR1 dumped both
    # allocators' counts after the idle window.
    pymalloc_text, _, glibc_text = timed["log"].partition("Arena 0:")
    return {
        "imports": stages,
        "footprint_at_ready": {**status_memory(plain["status"]), **exact_memory(plain["smaps"])},
        "pymalloc": pymalloc_figures(pymalloc_text),
        "glibc_malloc": glibc_malloc_figures("Arena 0:" + glibc_text),
        "anon_kib_by_mapping": anon_by_mapping(plain["smaps"]),
        "threads_wakeups": plain["threads"],
        "idle_s": idle_s,
        "import_self_us_by_package": import_self_times(timed["log"]),
        "python_heap_bytes_by_file": json.loads(dump),
    }
