"""Open a VMM's API by its kind and socket: each backend imported only when asked for, so a
host without qemu.qmp (the vm extra) still drives Cloud Hypervisor and Firecracker."""

from __future__ import annotations

from guestagent.host.tls import let_ssl_in
from guestagent.host.vmm.base import CLOUD_HYPERVISOR, FIRECRACKER, QEMU, Vmm

KINDS = (QEMU, CLOUD_HYPERVISOR, FIRECRACKER)


def open_vmm(kind: str, path: str, timeout: float) -> Vmm:
    """The VMM of `kind` whose API listens at `path`; VmmError naming the path when nothing
    answers there."""
    if kind == CLOUD_HYPERVISOR:
        from guestagent.host.vmm.cloud_hypervisor import CloudHypervisorVmm

        return CloudHypervisorVmm(path, timeout)
    if kind == FIRECRACKER:
        from guestagent.host.vmm.firecracker import FirecrackerVmm

        return FirecrackerVmm(path, timeout)
    if kind != QEMU:
        raise ValueError(f"no VMM kind {kind!r}: one of {', '.join(KINDS)}")
    let_ssl_in()  # qemu.qmp imports ssl (host/tls.py).
    from guestagent.host.vmm.qemu import QemuMonitor, QemuVmm

    return QemuVmm(QemuMonitor(path, timeout))
