"""The Kata guest extension's pure parts: names, verity params, components.toml, layout."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from guestagent.build.extension import (
    BUNDLE_UNIT,
    FIRST_PARTITION_OFFSET,
    ExtensionError,
    Process,
    VerityParams,
    agent_process,
    check_name,
    components_toml,
    disk_layout,
    operator_unit,
    root_hash_of,
    runtime_snippet,
)
from guestagent.sizes import MIB

PARAMS = VerityParams("ab" * 32, "cd" * 32, 6400)


@pytest.mark.parametrize("name", ["guestagent", "a", "x_y-Z9", "0123456789"])
def test_names_that_fit(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "guest.agent", "a/b", "guestagent1", "naïve", "a b"])
def test_names_refused(name: str) -> None:
    with pytest.raises(ExtensionError):
        check_name(name)


def test_params_string_is_kata_s_order() -> None:
    assert str(PARAMS) == (
        f"root_hash={'ab' * 32},salt={'cd' * 32},data_blocks=6400,"
        "data_block_size=4096,hash_block_size=4096"
    )


def test_params_round_trip() -> None:
    assert VerityParams.parse(str(PARAMS) + "\n") == PARAMS


@pytest.mark.parametrize(
    "text",
    ["", "root_hash=ab", str(PARAMS).replace("6400", "x"), str(PARAMS).replace(",salt=", ",")],
)
def test_params_incomplete_or_bad(text: str) -> None:
    with pytest.raises(ExtensionError):
        VerityParams.parse(text)


def test_root_hash_from_veritysetup_report() -> None:
    report = "VERITY header information for x\nSalt:            \tcdcd\nRoot hash:      \tabab01\n"
    assert root_hash_of(report) == "abab01"
    with pytest.raises(ExtensionError):
        root_hash_of("Salt: cdcd\n")


def test_components_toml_is_toml_kata_agent_reads() -> None:
    text = components_toml([agent_process(["--allow-cid", "1"])])
    parsed = tomllib.loads(text)
    assert parsed["schema_version"] == 1
    (process,) = parsed["process"]
    assert process["id"] == "guestagent" and process["level"] == 1
    assert process["path"] == "bin/guestagent"
    assert process["args"] == [
        "serve",
        "--listen",
        "vsock://:6464",
        "--listen",
        "unix:///run/guestagent.sock",
        "--allow-cid",
        "1",
    ]
    assert process["wait_socket"] == "/run/guestagent.sock"
    # kata-agent parses timeout_secs from a string.
    assert process["timeout_secs"] == "30"
    # No PATH: the agent runs its own mkswap and blkid first (linux/tools.py), and
    # kata-agent's ${extension_root} names the coco extension's root, not this one's.
    assert process["env"] == {"LC_ALL": "C"}


def test_processes_keep_file_order_and_omit_what_is_unset() -> None:
    text = components_toml([Process("a", "bin/a"), Process("b", "bin/b", level=2, args=("x",))])
    parsed = tomllib.loads(text)
    assert [p["id"] for p in parsed["process"]] == ["a", "b"]
    assert "wait_socket" not in parsed["process"][0] and "env" not in parsed["process"][0]


@pytest.mark.parametrize("path", ["/bin/a", "../a", "bin/../../a", ""])
def test_process_paths_stay_in_the_root(path: str) -> None:
    with pytest.raises(ExtensionError):
        Process("a", path)


@pytest.mark.parametrize("arg", ['say "hi"\\', "tab\there", "é"])
def test_strings_the_guest_reader_cannot_undo_are_refused(arg: str) -> None:
    with pytest.raises(ExtensionError):
        components_toml([Process("a", "bin/a", args=(arg,))])


def test_layout_partitions_follow_each_other() -> None:
    layout = disk_layout(25 * MIB, 53248)
    assert layout.data_offset == FIRST_PARTITION_OFFSET == MIB
    assert layout.hash_offset == 26 * MIB and layout.hash_bytes == MIB
    assert layout.total_bytes == 27 * MIB
    assert layout.sfdisk_script(0x940DE2B7).splitlines() == [
        "label: dos",
        "label-id: 0x940de2b7",
        "unit: sectors",
        "start=2048, size=51200, type=83, bootable",
        "start=53248, size=2048, type=83",
    ]


@pytest.mark.parametrize(("data", "hashes"), [(MIB + 4096, 4096), (0, 4096), (MIB, 0)])
def test_layout_refuses_partial_partitions(data: int, hashes: int) -> None:
    with pytest.raises(ExtensionError):
        disk_layout(data, hashes)


def test_runtime_snippet_names_the_image_and_params() -> None:
    snippet = tomllib.loads(runtime_snippet(Path("/srv/ext.img"), PARAMS))
    (entry,) = snippet["hypervisor"]["qemu"]["guest_extension_images"]
    assert entry == {"name": "guestagent", "path": "/srv/ext.img", "verity_params": str(PARAMS)}


def test_operator_unit_runs_from_the_mount_after_it() -> None:
    unit = operator_unit(BUNDLE_UNIT.read_text())
    assert "After=kata-extension-mount@guestagent.service" in unit
    assert (
        "ExecStart=/run/kata-extensions/guestagent/bin/guestagent serve --listen vsock://:6464"
        in unit
    )
    assert "${extension_root}" not in unit
