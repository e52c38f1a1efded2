"""What a sandbox VM is to the node daemon, and where each runtime leaves one: pure functions
from names and paths to records. The runtimes' contracts are quoted in docs/node.md with the
upstream file and commit each comes from (Kata Containers 4.1.0, ddcb1ad;
firecracker-containerd be68640).

- Kata, Go runtime: a directory /run/vc/sbs/<id> per sandbox, whose shim serves
  shim-monitor.sock there; the VM's sockets are in /run/vc/vm/<id> (Cloud Hypervisor's API
  clh-api.sock, QEMU's qmp.sock) or /run/vc/firecracker/<id>.
- Kata, runtime-rs: /run/kata/<id>, shim-monitor.sock there too, Cloud Hypervisor's API
  ch-api.sock beside it; a jailed Firecracker keeps /run/kata/firecracker/<id>, which is no
  sandbox (it has no shim socket).
- firecracker-containerd: <shim-base>/<namespace>#<vmID> with firecracker.sock (the API) and
  firecracker.vsock (hybrid vsock).
- A declared VM: what the node's file says.

The shim's `GET /agent-url` names the guest's init agent (`vsock://CID:1024`,
`hvsock:///path:1024`); this agent is reached the same way on its own port.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum

from guestagent.errors import AgentError
from guestagent.host.vmm.base import CLOUD_HYPERVISOR, FIRECRACKER, QEMU
from guestagent.transport.address import (
    DEFAULT_VSOCK_PORT,
    HybridVsockAddress,
    VsockAddress,
    parse_address,
)

KATA_GO, KATA_RS, FIRECRACKER_CONTAINERD, DECLARED = (
    "kata",
    "kata-runtime-rs",
    "firecracker-containerd",
    "declared",
)
SHIM_SOCKET = "shim-monitor.sock"
FC_API_SOCKET, FC_VSOCK = "firecracker.sock", "firecracker.vsock"
DRAGONBALL = "dragonball"


class Balloon(Enum):
    """Whether the daemon drives the VM's balloon."""

    FOLLOW = "follow"  # Ours to keep at the agent's figure.
    NONE = "none"  # There is none, or no API reaches it: free page reporting alone.
    RUNTIME = "runtime"  # The runtime drives it (Dragonball): a second driver would fight it.
    LEAVE = "leave"  # There is one, but the node's policy leaves it alone.


@dataclass(frozen=True)
class Vmm:
    kind: str  # qemu, cloud-hypervisor, firecracker, dragonball, or "" when unknown
    api: str | None  # The API socket this daemon may use; None: none it may.


@dataclass(frozen=True)
class Sandbox:
    """One VM the node serves: where its agent is (or its shim, which knows) and its VMM."""

    id: str
    source: str  # KATA_GO, KATA_RS, FIRECRACKER_CONTAINERD or DECLARED
    agent: str | None  # The agent's address; None: ask the shim.
    shim: str | None  # The shim's monitor socket, for GET /agent-url.
    vmm: Vmm
    balloon: Balloon


class AgentUrlError(AgentError):
    """A shim's agent URL this daemon cannot use; the text quotes it."""


def agent_address(agent_url: str, port: int = DEFAULT_VSOCK_PORT, root: str = "/") -> str:
    """The address of this agent beside the init agent a shim's /agent-url names: the same
    CID or hybrid-vsock socket, this agent's port (as `kata-runtime exec` swaps the port for
    its console's). A hybrid vsock's path is the host's, so it is found under `root` as every
    runtime path is. runtime-rs answers an empty body on error; remote:// and mock:// VMs
    have no vsock this daemon can reach."""
    url = agent_url.strip()
    if not url:
        raise AgentUrlError("the shim gave no agent URL (runtime-rs answers empty on error)")
    try:
        address = parse_address(url)
    except AgentError as e:
        raise AgentUrlError(f"agent URL {url!r} is not vsock:// or hvsock://: {e}") from None
    if isinstance(address, VsockAddress):
        return f"vsock://{address.cid}:{port}"
    if isinstance(address, HybridVsockAddress):
        return f"hvsock://{os.path.join(root, address.path.lstrip('/'))}:{port}"
    raise AgentUrlError(f"agent URL {url!r} is not vsock:// or hvsock://")


def hybrid_vsock_vmm(agent_url: str) -> str:
    """The VMM a runtime-rs hybrid vsock path names, for a VM without an API socket this
    daemon found: Dragonball's /run/kata/<id>/root/kata.hvsock, Firecracker's kata.hvsock
    elsewhere; "" when the URL says nothing."""
    path = agent_url.strip().removeprefix("hvsock://").rpartition(":")[0]
    if not path.endswith("/kata.hvsock"):
        return ""
    parts = path.split("/")
    if parts[1:3] == ["run", "kata"] and "firecracker" not in parts and parts[-2] == "root":
        return DRAGONBALL
    return FIRECRACKER


@dataclass(frozen=True)
class Layout:
    """Where the runtimes keep their sandboxes on this host (the node's --root changes the
    prefix, so tests and containers can point it elsewhere)."""

    root: str = "/"
    shim_base: str = "/var/lib/firecracker-containerd/shim-base"

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *(part.lstrip("/") for part in parts))

    @property
    def kata_go(self) -> str:
        return self.path("run/vc/sbs")

    @property
    def kata_rs(self) -> str:
        return self.path("run/kata")

    @property
    def firecracker_containerd(self) -> str:
        return self.path(self.shim_base)


def kata_vmm(layout: Layout, source: str, sandbox_id: str, exists: set[str]) -> Vmm:
    """The VMM of a Kata sandbox by the sockets its runtime made (`exists`: the paths found).
    Cloud Hypervisor's API is this daemon's to use; QEMU's QMP takes one client and the shim
    holds it for the sandbox's life, so it is named without a socket; Firecracker under Kata
    has no balloon."""
    if source == KATA_GO:
        candidates = [
            (CLOUD_HYPERVISOR, layout.path("run/vc/vm", sandbox_id, "clh-api.sock"), True),
            (QEMU, layout.path("run/vc/vm", sandbox_id, "qmp.sock"), False),
            (FIRECRACKER, layout.path("run/vc/firecracker", sandbox_id), False),
        ]
    else:
        candidates = [
            (CLOUD_HYPERVISOR, layout.path("run/kata", sandbox_id, "ch-api.sock"), True),
            (FIRECRACKER, layout.path("run/kata/firecracker", sandbox_id), False),
        ]
    for kind, path, usable in candidates:
        if path in exists:
            return Vmm(kind, path if usable else None)
    return Vmm("", None)


def kata_balloon(vmm: Vmm) -> Balloon:
    """A Kata sandbox's balloon: Cloud Hypervisor's exists only with
    reclaim_guest_freed_memory, at size 0 and driven by nothing (the backend says when there
    is none); Dragonball's is resized by the runtime; the others have none this daemon can
    reach."""
    if vmm.kind == CLOUD_HYPERVISOR and vmm.api is not None:
        return Balloon.FOLLOW
    if vmm.kind == DRAGONBALL:
        return Balloon.RUNTIME
    return Balloon.NONE


def kata_sandbox(layout: Layout, source: str, sandbox_id: str, exists: set[str]) -> Sandbox:
    """A Kata sandbox whose shim socket is in `exists`: its agent is asked of the shim."""
    directory = layout.kata_go if source == KATA_GO else layout.kata_rs
    vmm = kata_vmm(layout, source, sandbox_id, exists)
    shim = os.path.join(directory, sandbox_id, SHIM_SOCKET)
    return Sandbox(sandbox_id, source, None, shim, vmm, kata_balloon(vmm))


def firecracker_containerd_sandbox(
    layout: Layout, name: str, follow: bool, port: int = DEFAULT_VSOCK_PORT
) -> Sandbox | None:
    """A firecracker-containerd VM from its shim directory's name, `<namespace>#<vmID>`;
    None for any other name. Its balloon exists only if the VM was created with one, and
    firecracker-containerd's own API can resize it too: the node's policy says whether this
    daemon follows it."""
    namespace, sep, vm_id = name.partition("#")
    if not (sep and namespace and vm_id):
        return None
    directory = os.path.join(layout.firecracker_containerd, name)
    vsock = os.path.join(directory, FC_VSOCK)
    vmm = Vmm(FIRECRACKER, os.path.join(directory, FC_API_SOCKET))
    balloon = Balloon.FOLLOW if follow else Balloon.LEAVE
    return Sandbox(name, FIRECRACKER_CONTAINERD, f"hvsock://{vsock}:{port}", None, vmm, balloon)
