"""What a guest costs, measured in real boots: the figures `guestctl plan --model` fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guestagent.host.ctl import main as ctl_main
from guestagent.host.measure import measure_size, table_text
from guestagent.host.sizing import MIB, OverheadSample, fit_model, model_to_dict

pytestmark = pytest.mark.vm

# Two small sizes on either side of the 512 MiB THP threshold; ~20 s a boot under TCG.
SIZES_MIB = (306, 756)


@pytest.fixture(scope="module")
def samples(image: Path) -> list[OverheadSample]:
    # Other QEMU guests may share this machine's two cores: boots get a generous deadline.
    return [measure_size(size, image, boot_timeout=300) for size in SIZES_MIB]


def test_figures_are_self_consistent(samples: list[OverheadSample]) -> None:
    for s in samples:
        assert s.guest_resident_method == "smaps", "the guest RAM mapping was not found"
        assert s.present >= s.mem_total
        assert 0 < s.kernel < s.vm_size // 4
        assert 0 < s.used < s.mem_total
        assert 10 * MIB <= s.agent_rss <= 200 * MIB
        assert 0 < s.guest_resident <= s.vm_size
        assert s.vmm > 0
    small, large = samples
    # memmap alone is 64 bytes per 4 KiB page: 7 MiB more for 450 MiB more RAM.
    assert large.kernel - small.kernel >= (large.vm_size - small.vm_size) // 100


def test_fitted_model_goes_through_the_samples_and_plan_reads_it(
    samples: list[OverheadSample], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = fit_model(samples, "vm test")
    print(table_text(model))
    assert model.kernel.slope > 0
    for s in samples:
        assert 0 <= model.kernel.at(s.vm_size) - s.kernel <= MIB
        assert model.vmm.at(s.vm_size) >= s.vmm
    path = tmp_path / "model.json"
    path.write_text(json.dumps(model_to_dict(model)))
    capsys.readouterr()
    code = ctl_main(
        ["--json", "plan", "--model", str(path), "--default-memory", "256",
         "--container", "limit=256Mi", "--pod-limit", "2Gi"]
    )  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["model_source"] == "vm test"
    assert result["vm_size"] == 512 * MIB and result["kernel"] == model.kernel.at(512 * MIB)
