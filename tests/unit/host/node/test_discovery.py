"""Discovery over a fake /run tree laid out as each runtime lays it out (docs/node.md quotes
where each path comes from): Kata's Go runtime and runtime-rs with each VMM,
firecracker-containerd, the declared file; sandboxes that appear, go, and are found twice."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from guestagent.host.node.config import Discovery
from guestagent.host.node.discovery import Finder, Found, scanning
from guestagent.host.node.sandboxes import (
    DECLARED,
    FIRECRACKER_CONTAINERD,
    KATA_GO,
    KATA_RS,
    Balloon,
    Vmm,
)


def socket_file(path: Path) -> None:
    """Where a server listens: discovery looks at names only (a socket's own path would be
    too long for AF_UNIX below pytest's temporary directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def kata_go(root: Path, sandbox: str, vmm_socket: str | None) -> None:
    socket_file(root / "run/vc/sbs" / sandbox / "shim-monitor.sock")
    if vmm_socket == "firecracker":
        (root / "run/vc/firecracker" / sandbox / "root").mkdir(parents=True)
    elif vmm_socket is not None:
        socket_file(root / "run/vc/vm" / sandbox / vmm_socket)


def finder(root: Path, declared: str = "", follow_fc: bool = True) -> Finder:
    policy = Discovery(root=str(root), shim_base="/var/lib/fc/shim-base", declared=declared)
    return Finder(policy, follow_fc)


def test_every_runtimes_layout(tmp_path: Path) -> None:
    kata_go(tmp_path, "go-clh", "clh-api.sock")
    kata_go(tmp_path, "go-qemu", "qmp.sock")
    kata_go(tmp_path, "go-fc", "firecracker")
    socket_file(tmp_path / "run/kata/rs-clh/shim-monitor.sock")
    socket_file(tmp_path / "run/kata/rs-clh/ch-api.sock")
    socket_file(tmp_path / "run/kata/rs-db/shim-monitor.sock")  # Dragonball: no API socket.
    # runtime-rs's jailed Firecracker: a directory beside the sandboxes that is none.
    socket_file(tmp_path / "run/kata/firecracker/rs-fc/root/run/fc.sock")
    socket_file(tmp_path / "run/kata/rs-fc/shim-monitor.sock")
    socket_file(tmp_path / "var/lib/fc/shim-base/default#vm1/firecracker.sock")
    socket_file(tmp_path / "var/lib/fc/shim-base/default#vm1/firecracker.vsock")
    found = finder(tmp_path).scan()
    by_id = found.sandboxes
    assert sorted(by_id) == [
        "default#vm1", "go-clh", "go-fc", "go-qemu", "rs-clh", "rs-db", "rs-fc"
    ]  # fmt: skip
    assert found.problems == ()
    assert by_id["go-clh"].source == KATA_GO
    assert by_id["go-clh"].vmm == Vmm(
        "cloud-hypervisor", f"{tmp_path}/run/vc/vm/go-clh/clh-api.sock"
    )
    assert by_id["go-clh"].balloon is Balloon.FOLLOW
    assert by_id["go-clh"].shim == f"{tmp_path}/run/vc/sbs/go-clh/shim-monitor.sock"
    assert (by_id["go-qemu"].vmm, by_id["go-qemu"].balloon) == (Vmm("qemu", None), Balloon.NONE)
    assert (by_id["go-fc"].vmm, by_id["go-fc"].balloon) == (Vmm("firecracker", None), Balloon.NONE)
    assert by_id["rs-clh"].source == KATA_RS and by_id["rs-clh"].balloon is Balloon.FOLLOW
    assert by_id["rs-fc"].vmm == Vmm("firecracker", None)
    assert by_id["rs-db"].vmm == Vmm("", None) and by_id["rs-db"].balloon is Balloon.NONE
    fc = by_id["default#vm1"]
    assert fc.source == FIRECRACKER_CONTAINERD and fc.balloon is Balloon.FOLLOW
    assert (
        fc.agent == f"hvsock://{tmp_path}/var/lib/fc/shim-base/default#vm1/firecracker.vsock:6464"
    )


def test_a_sandbox_counts_once_its_shim_serves(tmp_path: Path) -> None:
    (tmp_path / "run/vc/sbs/early").mkdir(parents=True)  # The VM still booting.
    (tmp_path / "var/lib/fc/shim-base/default#vm2").mkdir(parents=True)  # No vsock yet.
    assert finder(tmp_path).scan().sandboxes == {}
    socket_file(tmp_path / "run/vc/sbs/early/shim-monitor.sock")
    assert list(finder(tmp_path).scan().sandboxes) == ["early"]


def test_no_runtime_directory_is_no_sandbox_and_no_error(tmp_path: Path) -> None:
    assert finder(tmp_path).scan() == Found({}, ())


DECLARED_VMS = """
[[vm]]
id = "pool-1"
agent = "hvsock:///run/pool/1/vsock.sock:6464"
vmm = "cloud-hypervisor"
api = "/run/pool/1/api.sock"

[[vm]]
id = "go-clh"
agent = "tcp://127.0.0.1:1"
"""


def test_declared_vms_and_a_sandbox_found_twice(tmp_path: Path) -> None:
    kata_go(tmp_path, "go-clh", "clh-api.sock")
    declared = tmp_path / "vms.toml"
    declared.write_text(DECLARED_VMS)
    found = finder(tmp_path, str(declared)).scan()
    assert found.sandboxes["pool-1"].source == DECLARED
    assert found.sandboxes["pool-1"].balloon is Balloon.FOLLOW
    # The runtime's is kept; the second finding is one problem line.
    assert found.sandboxes["go-clh"].source == KATA_GO
    assert found.problems == (
        "sandbox 'go-clh' is found by both kata and declared: served as kata's",
    )


def test_a_declared_file_that_breaks_keeps_its_last_list(tmp_path: Path) -> None:
    declared = tmp_path / "vms.toml"
    declared.write_text(DECLARED_VMS)
    vms = finder(tmp_path, str(declared))
    assert set(vms.scan().sandboxes) == {"pool-1", "go-clh"}
    declared.write_text('[[vm]]\nid = "x"\nagnet = "tcp://h:1"\n')
    os.utime(declared, ns=(1, 1))  # A new stamp whatever the clock's granularity.
    broken = vms.scan()
    assert set(broken.sandboxes) == {"pool-1", "go-clh"}
    (problem,) = broken.problems
    assert "vm 1: no key 'agnet'" in problem and "keeping the last list of 2 VMs" in problem
    declared.unlink()
    gone = vms.scan()
    assert set(gone.sandboxes) == {"pool-1", "go-clh"}
    assert "No such file or directory; keeping the last list" in gone.problems[0]


def test_a_sandbox_that_appears_or_goes_is_seen_within_a_second_by_inotify(
    tmp_path: Path,
) -> None:
    """The rescan is every 30 s here: only inotify can wake it in time."""
    (tmp_path / "run/vc/sbs").mkdir(parents=True)
    seen: list[set[str]] = []
    stopping = threading.Event()
    thread = threading.Thread(
        target=scanning,
        args=(finder(tmp_path), lambda f: seen.append(set(f.sandboxes)), stopping.is_set, 30.0),
        daemon=True,
    )
    thread.start()

    def wait_for(wanted: set[str]) -> float:
        started = time.monotonic()
        while not seen or seen[-1] != wanted:
            assert time.monotonic() - started < 5, seen
            time.sleep(0.01)
        return time.monotonic() - started

    wait_for(set())
    (tmp_path / "run/vc/sbs/new").mkdir()
    socket_file(tmp_path / "run/vc/sbs/new/shim-monitor.sock")
    assert wait_for({"new"}) < 1.0
    for name in ("shim-monitor.sock",):
        (tmp_path / "run/vc/sbs/new" / name).unlink()
    (tmp_path / "run/vc/sbs/new").rmdir()
    assert wait_for(set()) < 1.0
    stopping.set()
    (tmp_path / "run/vc/sbs/wake").mkdir()  # Wakes the wait, so the thread sees it stop.
    thread.join(5)
    assert not thread.is_alive()


@pytest.mark.parametrize("follow", [True, False])
def test_firecracker_containerds_balloon_follows_the_policy(tmp_path: Path, follow: bool) -> None:
    socket_file(tmp_path / "var/lib/fc/shim-base/ns#vm/firecracker.vsock")
    found = finder(tmp_path, follow_fc=follow).scan()
    assert found.sandboxes["ns#vm"].balloon is (Balloon.FOLLOW if follow else Balloon.LEAVE)
