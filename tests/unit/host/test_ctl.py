"""guestctl's command line, where it does not need an agent."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestagent.agent import cli as agent_cli
from guestagent.host import ctl
from guestagent.host.commands import common
from guestagent.host.ctl import main as ctl_main
from guestagent.host.sizing.model import fit_model, model_to_dict
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.sizing import sample


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["limits", "--cgroup", "a", "--limit", "512Mi"], {"limit": 512 * MIB}),
        (["limits", "--cgroup", "a", "--limit", "512M", "--swap", "1G"], {"swap": 1 << 30}),
        (["limits", "--cgroup", "a", "--limit", "-1", "--swap", "max"], {"swap": -1}),
        (["limits", "--cgroup", "a", "--reservation", "64KiB"], {"reservation": 64 << 10}),
        (["reclaim", "now", "--cgroup", "a", "--bytes", "512Mi"], {"bytes": 512 * MIB}),
        (["reclaim", "--cgroup", "a", "--bytes", "1Gi"], {"legacy_bytes": 1 << 30}),
        (["reclaim", "on", "--cgroup", "a", "--anon"], {"reclaim_command": "on", "anon": True}),
        (["reclaim", "status", "--cgroup", "a", "--cgroup", "b"], {"cgroup": ["a", "b"]}),
        (["plan", "--pod-limit", "max"], {"pod_limit": None}),
        (["plan", "--pod-limit", "2Gi", "--host-memory", "8G"], {"host_memory": 8 << 30}),
        (["plan", "--pod-limit", "1G", "--container", "limit=512M"], {"pod_limit": 1 << 30}),
        (["swap", "enable", "--serial", "swap0"], {"swap_command": "enable", "serial": "swap0"}),
        (["swap", "list"], {"command": "swap", "swap_command": "list"}),
        (["watch", "--count", "3"], {"count": 3, "interval_ms": 0}),
        (["info", "--cold-after-ms", "5"], {"cold_after_ms": 5}),
        (["info", "--cold-after", "5"], {"cold_after_ms": 5}),  # the old spelling, hidden
        (["watch", "--cold-after", "7"], {"cold_after_ms": 7}),
        (["give-back", "--api", "s", "--safe", "--cold-after-ms", "9"], {"cold_after_ms": 9}),
    ],
)
def test_arguments(argv: list[str], expected: dict[str, object]) -> None:
    args = ctl.build_parser().parse_args(argv)
    assert {key: getattr(args, key) for key in expected} == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["limits", "--cgroup", "a", "--limit", "12X"], "size '12X' is not"),
        (["reclaim", "now", "--cgroup", "a", "--bytes", "-1"], "size '-1' is negative"),
        (["reclaim", "now", "--cgroup", "a"], "the following arguments are required: --bytes"),
        (["reclaim", "on"], "one of the arguments --cgroup --workloads is required"),
        (["reclaim", "off", "--cgroup", "a", "--cgroup", "b", "x"], "unrecognized arguments: x"),
        (["reclaim", "sideways"], "invalid choice: 'sideways'"),
        (["plan", "--pod-limit", "1G", "--container", "limit=1.5G"], "size '1.5G' is not"),
        (["plan", "--pod-limit", "1G", "--container", "cpu=1"], "'cpu=1' is not name="),
        (["measure-overhead", "--sizes", "306,0"], "'306,0' is not a list of MiB"),
        (["swap", "enable"], "one of the arguments --device --serial is required"),
    ],
)
def test_bad_arguments_exit_2_naming_the_value(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        ctl.build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("9223372036854775808", "over the largest, 9223372036854775807 bytes"),
        ("8388608T", "over the largest"),
        ("-1G", "-1 or max means unlimited"),
        ("-5", "-1 or max means unlimited"),
        ("64MB", "write 64MiB"),
    ],
)
@pytest.mark.parametrize("flag", ["--limit", "--swap", "--reservation"])
def test_a_limit_out_of_range_is_a_usage_error_not_a_traceback(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, 2^63 reached protobuf's int64 as `ValueError: Value out of range`, and `-1G`
    was taken for an option ("expected one argument")."""
    with pytest.raises(SystemExit) as exit_info:
        ctl_main(["--target", "unix:///nowhere", "limits", "--cgroup", "a", flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_a_negative_value_attached_to_its_flag_reaches_the_parser() -> None:
    argv = ["limits", "--limit", "-1G", "--swap=-1", "--create", "-1"]
    assert ctl.attach_negative_values(argv) == ["limits", "--limit=-1G", "--swap=-1", "--create=-1"]


def _options_without_help(parser: argparse.ArgumentParser, name: str) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from _options_without_help(subparser, f"{name} {sub}")
        elif action.option_strings and not action.help:
            yield f"{name} {action.option_strings[0]}"


@pytest.mark.parametrize(
    ("parser", "name"), [(ctl.build_parser(), "guestctl"), (agent_cli.build_parser(), "guestagent")]
)
def test_every_option_says_what_it_is_for(parser: argparse.ArgumentParser, name: str) -> None:
    assert list(_options_without_help(parser, name)) == []


def test_the_old_cold_after_spelling_is_hidden(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        ctl_main(["info", "--help"])
    out = capsys.readouterr().out
    assert "--cold-after-ms MS" in out
    assert "--cold-after MS" not in out


def test_every_command_is_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        ctl_main(["--help"])
    out = capsys.readouterr().out
    for name in ctl.COMMANDS:
        assert name.split(" ")[0] in out
    assert "1024-based" in out


@pytest.mark.parametrize("name", sorted(ctl.COMMANDS))
def test_every_command_has_its_own_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        ctl_main([*name.split(" "), "--help"])
    assert exit_info.value.code == 0
    assert f"usage: guestctl {name}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "missing", "extra"),
    [
        (["measure-overhead", "--sizes", "256"], "qemu", "vm"),
        (["--target", "unix:///x", "give-back", "--qmp", "/q", "--safe"], "qemu", "vm"),
    ],
)
def test_a_missing_extra_exits_2_saying_what_to_install(
    argv: list[str],
    missing: str,
    extra: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    real_find_spec = importlib.util.find_spec

    def without(name: str, package: str | None = None):  # type: ignore[no-untyped-def]
        return None if name.split(".")[0] == missing else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without)
    assert ctl.main(argv) == 2
    err = capsys.readouterr().err
    assert f"pip install 'guestagent[{extra}]'" in err
    assert err.count("\n") == 1  # one line, no traceback


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [("127.0.0.1:9464", "127.0.0.1", 9464), ("[::]:0", "::", 0), ("localhost:80", "localhost", 80)],
)
def test_metrics_listen(listen: str, host: str, port: int) -> None:
    args = ctl.build_parser().parse_args(["metrics", "--listen", listen])
    assert (args.listen.host, args.listen.port) == (host, port)
    assert (args.interval_ms, args.cgroup) == (5000, [])


@pytest.mark.parametrize(
    ("listen", "message"),
    [("9464", "has no port"), (":9464", "has no host"), ("h:70000", "out of range")],
)
def test_metrics_listen_refused(
    listen: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        ctl.build_parser().parse_args(["metrics", "--listen", listen])
    err = capsys.readouterr().err
    assert f"argument --listen: {listen!r} is not HOST:PORT" in err and message in err


def test_metrics_needs_a_target(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        ctl_main(["metrics", "--listen", "127.0.0.1:0"])
    assert exit_info.value.code == 2
    assert "metrics needs --target" in capsys.readouterr().err


def run_plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = ctl_main(["plan", "--host-memory", "31753Mi", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_guestctl_plan_clamps_the_issue_pod(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(capsys, "--container", "limit=1024000Mi", "--pod-limit", "1024200Mi")
    assert code == 0
    assert "hotplug      29696 MiB (clamped from 1024000 MiB)" in out
    assert "warning: clamped:" in out and "preflight ok" in out
    assert "RuntimeClass overhead to declare:" in out


def test_guestctl_plan_fails_a_pod_limit_below_the_vm(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(capsys, "--container", "limit=1Gi", "--pod-limit", "1184Mi")
    assert code == 1
    assert "preflight FAILED: pod limit 1184 MiB is below VM 3072 MiB" in out
    assert "short by" in out


def test_guestctl_plan_json_with_a_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    model_file = tmp_path / "model.json"
    model = fit_model([sample(m) for m in (306, 756, 1280)], "synthetic")
    model_file.write_text(json.dumps(model_to_dict(model)))
    code = ctl_main(
        [
            "--json",
            "plan",
            "--host-memory", "8G",
            "--default-memory", "256",
            "--container", "limit=512Mi,request=256Mi,name=app",
            "--container", "request=64Mi,name=sidecar",
            "--pod-limit", "2G",
            "--model", str(model_file),
        ]
    )  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["ok"]
    assert result["vm_size"] == 768 * MIB
    assert result["model_source"] == "synthetic"
    assert result["vmm"] == model.vmm.at(768 * MIB)
    assert any("'sidecar' requests 64 MiB" in w for w in result["warnings"])


@pytest.mark.parametrize(
    ("model_text", "message"), [("{", "model"), ('{"format": "x"}', "format is 'x'")]
)
def test_guestctl_plan_bad_model_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, model_text: str, message: str
) -> None:
    (tmp_path / "model.json").write_text(model_text)
    code, _, err = run_plan(capsys, "--pod-limit", "1G", "--model", str(tmp_path / "model.json"))
    assert code == 2 and message in err


@pytest.mark.parametrize(
    ("platform", "pod_limit", "code", "shown"),
    [
        # The survey's smallest SNP pod: 320 MiB on the host (VM 306 + 14), its limit 50 MiB
        # plus a RuntimeClass overhead of 256 (default_memory alone) is 306.
        ("sev-snp", "306Mi", 1, "preflight FAILED: pod limit 306 MiB is below VM 306 MiB + VMM"),
        ("sev-snp", "370Mi", 0, "preflight ok: pod limit 370 MiB covers VM 306 MiB"),
        ("tdx", "370Mi", 0, "kernel 100 MiB  guest daemons 50 MiB  VMM 46 MiB  (tdx (K3s, QEMU)"),
        # Plain rounds the 50 MiB hotplug up to a 128 MiB block: a 384 MiB VM.
        ("plain", "600Mi", 0, "VM size      384 MiB"),
    ],
)
def test_guestctl_plan_platform(
    capsys: pytest.CaptureFixture[str], platform: str, pod_limit: str, code: int, shown: str
) -> None:
    result = run_plan(
        capsys, "--platform", platform, "--default-memory", "256", "--container", "limit=50Mi",
        "--pod-limit", pod_limit,
    )  # fmt: skip
    assert result[0] == code and shown in result[1]


def test_guestctl_plan_block_size_0_is_exact(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(
        capsys, "--block-size", "0", "--default-memory", "256", "--container", "limit=50Mi",
        "--pod-limit", "max",
    )  # fmt: skip
    assert code == 0 and "VM size      306 MiB" in out


def test_guestctl_plan_refuses_a_model_file_with_a_confidential_platform(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    model_file = tmp_path / "model.json"
    model_file.write_text(json.dumps(model_to_dict(fit_model([sample(306)], "synthetic"))))
    code, _, err = run_plan(
        capsys, "--platform", "tdx", "--model", str(model_file), "--pod-limit", "1G"
    )
    assert code == 2 and "--model and --platform tdx both give the overheads" in err


def test_guestctl_plan_invalid_pod_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_plan(capsys, "--container", "limit=1M,request=2M", "--pod-limit", "1G")
    assert code == 2 and "above its limit" in err


def test_guestctl_commands_that_reach_an_agent_still_need_a_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        ctl_main(["info"])
    assert exit_info.value.code == 2
    assert "info needs --target" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["reclaim"],
        ["reclaim", "--cgroup", "a"],  # The old form without --bytes.
        ["reclaim", "--bytes", "1M"],
    ],
)
def test_reclaim_without_a_command_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        ctl_main(["--target", "unix:///nowhere", *argv])
    assert exit_info.value.code == 2
    assert "reclaim needs a command: now, on, off or status" in capsys.readouterr().err


def test_the_old_reclaim_form_still_runs_and_says_it_is_deprecated(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[str, int, int]] = []

    class Client:
        def __init__(self, target: str, timeout: float) -> None:
            pass

        def __enter__(self) -> Client:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def reclaim(self, cgroup: str, bytes_: int, drop_caches: int) -> pb.ReclaimResult:
            calls.append((cgroup, bytes_, drop_caches))
            return pb.ReclaimResult(
                current_before_bytes=2 * MIB, current_after_bytes=MIB, complete=True
            )

    monkeypatch.setattr(common, "AgentClient", Client)
    argv = ["--target", "unix:///x", "reclaim", "--cgroup", "a", "--bytes", "1M"]
    assert ctl_main([*argv, "--drop-caches", "1"]) == 0
    assert (
        ctl_main(["--target", "unix:///x", "reclaim", "now", "--cgroup", "a", "--bytes", "1M"]) == 0
    )
    assert calls == [("a", 1 << 20, 1), ("a", 1 << 20, 0)]
    captured = capsys.readouterr()
    assert captured.err.count("deprecated; use `reclaim now --cgroup C --bytes N`") == 1
    assert captured.out.count("a: memory.current 2.0 MiB -> 1.0 MiB") == 2


def test_python_dash_m_runs_guestctl() -> None:
    """`python -m guestagent.host.ctl` is guestctl: a script using that form must not succeed
    silently while doing nothing."""
    command = [sys.executable, "-m", "guestagent.host.ctl"]
    helped = subprocess.run([*command, "--help"], capture_output=True, text=True, check=False)
    assert helped.returncode == 0 and "give-back" in helped.stdout, helped
    untargeted = subprocess.run([*command, "info"], capture_output=True, text=True, check=False)
    assert untargeted.returncode == 2 and "info needs --target" in untargeted.stderr, untargeted


def test_measure_overhead_needs_an_image_directory(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An installed guestctl has no checkout to find the images in."""
    monkeypatch.delenv("GUESTAGENT_IMAGE_DIR", raising=False)
    with pytest.raises(SystemExit) as exited:
        ctl_main(["measure-overhead", "--sizes", "306"])
    assert exited.value.code == 2
    assert "needs --image-dir or $GUESTAGENT_IMAGE_DIR" in capsys.readouterr().err


def test_an_api_socket_that_is_not_there_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no" / "such.sock"
    argv = ["--target", "unix:///nowhere", "give-back", "--vmm", "cloud-hypervisor"]
    assert ctl_main([*argv, "--api", str(missing), "--safe"]) == 1
    err = capsys.readouterr().err
    assert err == f"guestctl: give-back: {missing}: No such file or directory\n", err
