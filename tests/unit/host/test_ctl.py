"""guestctl's command line, where it does not need an agent."""

from __future__ import annotations

import importlib.util

import pytest

from guestagent.host import ctl


def test_measure_overhead_without_the_vm_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_find_spec = importlib.util.find_spec

    def no_qemu(name: str, package: str | None = None):  # type: ignore[no-untyped-def]
        return None if name.split(".")[0] == "qemu" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", no_qemu)
    assert ctl.main(["measure-overhead", "--sizes", "256"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'guestagent[vm]'" in err
    assert err.count("\n") == 1  # one line, no traceback
