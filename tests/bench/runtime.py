"""The agent's own runtime against its budgets: the tree's size unpacked, the bundle's packed,
and, in one boot of the guest, the agent's start-to-serving time and VmRSS on its own runtime
beside the same agent code on the guest's Debian python3 (how the bundle ran it until the
runtime came with it), alternating, so both meet the same guest."""

from __future__ import annotations

import json
import statistics
import tarfile
from pathlib import Path
from typing import Any

from guestagent.host.sizing.boot import VMConfig
from guestagent.vm.qemu import GuestVM

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "image" / "build" / "guestagent-bundle.tar.xz"
TREE_BUDGET_BYTES = 48_000_000
BUNDLE_BUDGET_BYTES = 16_000_000
RATIO_BUDGET = 1.10
ROUNDS = 3
CALLS = 200
SITE = "/opt/guestagent/lib/python3/dist-packages"
OWN_RUNTIME = ["/opt/guestagent/bin/guestagent"]
GUEST_PYTHON = [
    "/usr/bin/python3",
    "-I",
    "-c",
    f"import sys; sys.path[:0] = ['{SITE}']; from guestagent.agent.entry import entry; "
    "sys.argv[0] = 'guestagent'; sys.exit(entry())",
]
AGENT_ARGS = ["serve", "--online-memory", "off", "--no-self-cgroup"]

# Runs in the guest on the bundle's interpreter: start the agent, time it to its first
# answered GetMemoryInfo, make CALLS more, read its VmRSS, stop it.
PROBE = """
import json, os, subprocess, sys, time
import grpc
command, socket = json.loads(sys.argv[1]), sys.argv[2]
started = time.monotonic()
agent = subprocess.Popen(command + ["--listen", "unix://" + socket],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
with grpc.insecure_channel("unix://" + socket) as channel:
    call = channel.unary_unary("/guestagent.v1.MemoryAgent/GetMemoryInfo")
    while True:
        try:
            call(b"", timeout=2)
            break
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or agent.poll() is not None:
                agent.kill()
                sys.exit(f"the agent did not serve: {error.code()}, exit {agent.poll()}")
            if time.monotonic() - started > 300:
                agent.kill()
                sys.exit("the agent did not serve within 300 s")
            time.sleep(0.02)
    ready = time.monotonic() - started
    for _ in range(int(sys.argv[3])):
        call(b"", timeout=60)
status = dict(line.split(":", 1) for line in open(f"/proc/{agent.pid}/status"))
agent.terminate()
agent.wait(30)
print(json.dumps({"ready_s": round(ready, 3), "vm_rss_kib": int(status["VmRSS"].split()[0])}))
"""


def sizes() -> dict[str, Any]:
    with tarfile.open(BUNDLE) as archive:
        unpacked = sum(m.size for m in archive.getmembers() if m.name.startswith("opt/guestagent"))
    packed = BUNDLE.stat().st_size
    return {
        "tree_unpacked_bytes": unpacked,
        "tree_at_most_48_mb": unpacked <= TREE_BUDGET_BYTES,
        "bundle_packed_bytes": packed,
        "bundle_at_most_16_mb": packed <= BUNDLE_BUDGET_BYTES,
    }


def probe(vm: GuestVM, command: list[str], socket: str) -> dict[str, float]:
    vm.exec("cat > /run/runtime-probe.py", stdin=PROBE)
    argv = ["/opt/guestagent/bin/python3", "/run/runtime-probe.py"]
    output = vm.exec([*argv, json.dumps(command + AGENT_ARGS), socket, str(CALLS)], timeout=600)
    figures: dict[str, float] = json.loads(output.stdout)
    return figures


def ratio_verdict(own: float, before: float) -> dict[str, Any]:
    ratio = own / before
    return {"ratio": round(ratio, 3), "budget": RATIO_BUDGET, "met": ratio <= RATIO_BUDGET}


def measure_runtime() -> dict[str, Any]:
    results: dict[str, Any] = {"sizes": sizes()}
    with GuestVM(VMConfig(memory_mib=1024)) as vm:
        results["boot_to_serving_s"] = round(vm.boot_seconds or 0.0, 1)
        runs: dict[str, list[dict[str, float]]] = {"own_runtime": [], "guest_python": []}
        for round_ in range(ROUNDS):
            runs["own_runtime"].append(probe(vm, OWN_RUNTIME, f"/run/own{round_}.sock"))
            runs["guest_python"].append(probe(vm, GUEST_PYTHON, f"/run/guest{round_}.sock"))
    medians = {
        name: {key: statistics.median(r[key] for r in samples) for key in samples[0]}
        for name, samples in runs.items()
    }
    own, before = medians["own_runtime"], medians["guest_python"]
    results |= {
        "runs": runs,
        "medians": medians,
        "ready_own_vs_guest_python": ratio_verdict(own["ready_s"], before["ready_s"]),
        "vm_rss_own_vs_guest_python": ratio_verdict(own["vm_rss_kib"], before["vm_rss_kib"]),
    }
    return results
