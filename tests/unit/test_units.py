"""The agent's cgroup is bounded the same however it is started: by itself (ops/self_cgroup.py),
by the bundle's unit (image/guestagent.service) or by the Kata extension's, made from the
bundle's with its hardening."""

from __future__ import annotations

from guestagent.build.extension import BUNDLE_UNIT, PREFIX, operator_unit
from guestagent.host.units import parse_size
from guestagent.ops.self_cgroup import MEMORY_HIGH, MEMORY_MIN

# What the extension's unit sets otherwise than the bundle's, and why (build/extension.py).
EXTENSION_ONLY = {"Requires", "ReadWritePaths=/run"}
BUNDLE_ONLY = {"EnvironmentFile"}
REPLACED = {"Description", "ExecStart", "After"}


def directives(unit: str) -> list[tuple[str, str, str]]:
    """(section, key, value) of each setting, comments and blank lines left out."""
    found, section = [], ""
    for line in unit.splitlines():
        if line.startswith("["):
            section = line
        elif line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found.append((section, key, value))
    return found


def memory_bounds(unit: str) -> dict[str, int]:
    return {
        key: parse_size(value)
        for section, key, value in directives(unit)
        if section == "[Service]" and key.startswith("Memory")
    }


def test_the_bundles_unit_sets_the_agents_own_bounds() -> None:
    assert memory_bounds(BUNDLE_UNIT.read_text()) == {
        "MemoryMin": MEMORY_MIN,
        "MemoryHigh": MEMORY_HIGH,
    }


def test_the_extensions_unit_is_the_bundles_started_from_the_mount() -> None:
    bundle = BUNDLE_UNIT.read_text()
    extension = operator_unit(bundle)
    assert memory_bounds(extension) == memory_bounds(bundle)
    ours, theirs = set(directives(extension)), set(directives(bundle))

    def kind(setting: tuple[str, str, str]) -> set[str]:
        return {setting[1], f"{setting[1]}={setting[2]}"}

    assert {s for s in ours - theirs if not kind(s) & (EXTENSION_ONLY | REPLACED)} == set()
    assert {s for s in theirs - ours if not kind(s) & (BUNDLE_ONLY | REPLACED)} == set()
    assert ("[Service]", "ExecStart", f"{PREFIX}/bin/guestagent serve --listen vsock://:6464 "
            "--listen unix:///run/guestagent.sock") in ours  # fmt: skip
    assert ("[Unit]", "After", "systemd-udevd.service local-fs.target") in ours
    assert ("[Service]", "ProtectSystem", "strict") in ours
