"""The plan as text and as the --json dict."""

from __future__ import annotations

import json

import pytest

from guestagent.host.sizing.plan import PodSizing, plan
from guestagent.host.sizing.text import plan_text, plan_to_dict, verdict_text
from guestagent.sizes import MIB
from tests.fakes.sizing import FLAT, HOST, limits


def one_gib_pod(pod_limit_mib: int | None) -> PodSizing:
    """VM 2048 + 1024 MiB, VMM 100 MiB under FLAT: the host holds 3172 MiB."""
    return PodSizing(
        host_memory=HOST,
        default_memory=2048 * MIB,
        containers=limits(1024),
        pod_limit=None if pod_limit_mib is None else pod_limit_mib * MIB,
    )


@pytest.mark.parametrize(
    ("pod_limit_mib", "verdict"),
    [
        (
            None,
            "preflight ok: the pod has no memory limit on the host; it will use "
            "VM 3072 MiB + VMM overhead 100 MiB = 3172 MiB",
        ),
        (
            3172,
            "preflight ok: pod limit 3172 MiB covers VM 3072 MiB + VMM overhead 100 MiB = 3172 MiB",
        ),
        (
            1184,
            "preflight FAILED: pod limit 1184 MiB is below VM 3072 MiB + VMM overhead 100 MiB = "
            "3172 MiB: short by 1988 MiB; the host would OOM-kill the VM once the guest faults "
            "its RAM in. Raise the pod limit (declare a RuntimeClass overhead of 2148 MiB) or "
            "lower default_memory",
        ),
    ],
)
def test_verdict_text(pod_limit_mib: int | None, verdict: str) -> None:
    assert verdict_text(plan(one_gib_pod(pod_limit_mib), FLAT)) == verdict


def test_plan_text_lines() -> None:
    lines = plan_text(plan(one_gib_pod(4000), FLAT)).splitlines()
    assert lines == [
        "hotplug      1024 MiB",
        "VM size      3072 MiB (ceiling 31753 MiB)",
        "overhead     kernel 40 MiB  guest daemons 60 MiB  VMM 100 MiB  (flat)",
        "containers   2972 MiB left for them (VM - kernel - daemons)",
        "RuntimeClass overhead to declare: 2148 MiB",
        "preflight ok: pod limit 4000 MiB covers VM 3072 MiB + VMM overhead 100 MiB = 3172 MiB",
    ]


def test_plan_text_shows_the_clamp_and_its_warning() -> None:
    sizing = PodSizing(host_memory=HOST, default_memory=2048 * MIB, containers=limits(1024000))
    lines = plan_text(plan(sizing, FLAT)).splitlines()
    # Whole 128 MiB blocks below the 31753 MiB host: 29696, not 31753 - 2048.
    assert lines[0] == "hotplug      29696 MiB (clamped from 1024000 MiB)"
    (warning,) = [line for line in lines if line.startswith("warning: ")]
    assert warning.startswith("warning: clamped: the containers' limits want 1024000 MiB")


def test_plan_to_dict_is_json_with_the_verdict() -> None:
    document = json.loads(json.dumps(plan_to_dict(plan(one_gib_pod(1184), FLAT))))
    assert document["ok"] is False
    assert document["shortfall"] == 1988 * MIB
    assert document["hotplug"] == {
        "wanted": 1024 * MIB,
        "amount": 1024 * MIB,
        "ceiling": HOST,
        "clamped": False,
    }
