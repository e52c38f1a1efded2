"""How the runtime builder runs the staged interpreter: directly for the host's machine,
under qemu-user for another's."""

from pathlib import Path

from guestagent.build.runtime import TARGETS, staged_command

TREE = Path("/build/tree")
PYTHON = Path("/debs/usr/bin/python3.11")


def test_the_hosts_machine_runs_through_the_trees_loader() -> None:
    command = staged_command(TREE, TARGETS["x86_64"], PYTHON, ["-c", "pass"], "x86_64")
    assert command == [
        "/build/tree/lib/ld-linux-x86-64.so.2",
        "--library-path",
        "/build/tree/lib",
        "/debs/usr/bin/python3.11",
        "-c",
        "pass",
    ]


def test_another_machine_runs_under_qemu_user_named_explicitly() -> None:
    command = staged_command(TREE, TARGETS["aarch64"], PYTHON, ["-c", "pass"], "x86_64")
    assert command[:2] == ["qemu-aarch64-static", "/build/tree/lib/ld-linux-aarch64.so.1"]
    assert command[-3:] == ["/debs/usr/bin/python3.11", "-c", "pass"]
    native = staged_command(TREE, TARGETS["aarch64"], PYTHON, [], "aarch64")
    assert native[0] == "/build/tree/lib/ld-linux-aarch64.so.1"
