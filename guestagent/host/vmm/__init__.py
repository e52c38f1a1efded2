"""The VMMs' APIs, as the host's tools use them: one backend per VMM (QEMU over QMP, Cloud
Hypervisor and Firecracker over their REST APIs on a unix socket), each reporting and sizing
its balloon in bytes the balloon takes and its virtio-mem devices in bytes plugged
(`base.py`), and a VMM process's resident memory (`rss.py`). Nothing here knows the agent."""
