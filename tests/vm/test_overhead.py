"""What a guest costs, measured in real boots: the figures `guestctl plan --model` fits."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from guestagent.host.client import AgentClient
from guestagent.host.ctl import main as ctl_main
from guestagent.host.sizing.measure import measure_size, table_text
from guestagent.host.sizing.model import Line, OverheadSample, fit_model, model_to_dict
from guestagent.sizes import MIB
from guestagent.vm.qemu import GuestVM

pytestmark = pytest.mark.vm

# Two small sizes on either side of the 512 MiB THP threshold; ~20 s a boot under TCG.
SIZES_MIB = (306, 756)
MAPPED = re.compile(r"software IO TLB: mapped \[mem (0x[0-9a-f]+)-(0x[0-9a-f]+)\]")
# debugfs read by hand, mounted for the read only if it was not.
NSLABS = (
    'd=/sys/kernel/debug; m=0; grep -q " $d debugfs " /proc/mounts || '
    "{ mount -t debugfs debugfs $d && m=1; }; cat $d/swiotlb/io_tlb_nslabs; r=$?; "
    "[ $m = 0 ] || umount $d; exit $r"
)
# The guest's own interpreter, for reading the boot log the way the agent does.
BOOT_LOG = (
    "from guestagent.linux.fs import KernelFS\n"
    "from guestagent.linux.swiotlb import parse_boot_log, read_kmsg\n"
    "print(parse_boot_log(read_kmsg(KernelFS())))"
)


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
    assert isinstance(model.kernel, Line) and model.kernel.slope > 0
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


def debugfs_mounts(vm: GuestVM) -> list[str]:
    return [line for line in read_mounts(vm).splitlines() if " debugfs " in line]


def read_mounts(vm: GuestVM) -> str:
    return vm.exec(["cat", "/proc/mounts"]).stdout


def test_overhead_reports_the_swiotlb_the_guest_kernel_mapped(
    vm: GuestVM, agent: AgentClient
) -> None:
    # The shared guest has a memory hotplug region (placed above 4 GiB), so its kernel maps
    # the default pool at boot and says so in its log.
    mounted = debugfs_mounts(vm)
    overhead = agent.overhead()
    assert overhead.WhichOneof("swiotlb") == "swiotlb_size", overhead.swiotlb_absent.reason
    assert overhead.swiotlb_size.source == "debugfs"
    assert overhead.swiotlb_size.bytes == 64 * MIB
    assert debugfs_mounts(vm) == mounted, "the agent left debugfs mounted"
    assert int(vm.exec(NSLABS).stdout) * 2048 == overhead.swiotlb_size.bytes
    # It is memblock memory: part of the kernel's reserve, not of MemTotal.
    assert overhead.swiotlb_size.bytes < overhead.kernel_reserved_bytes
    # The fallback reads the same pool from /dev/kmsg, as dmesg does, while the ring buffer
    # still holds the boot messages (a long session's may have lost them: then both lack it).
    logged = MAPPED.search(vm.exec(["dmesg"]).stdout)
    from_log = vm.exec(["/opt/guestagent/bin/python", "-c", BOOT_LOG]).stdout.strip()
    if logged:
        assert int(logged[2], 16) - int(logged[1], 16) == overhead.swiotlb_size.bytes
        assert from_log == f"Swiotlb(size={64 * MIB}, source='boot log')"
    else:
        assert "no longer starts at boot" in from_log
