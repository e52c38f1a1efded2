"""Pod names and namespaces by sandbox id, from the CRI (RuntimeService.ListPodSandbox), as
kata-monitor labels its series (src/runtime/pkg/kata-monitor/cri.go, Kata 4.1.0): the ready
sandboxes, read again while a served sandbox has no name yet; the endpoint is containerd's or
CRI-O's socket (--cri-socket). A CRI that does not answer names nothing: the series go out
unnamed, never late."""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from guestagent.host.node import cri_pb2 as cri
from guestagent.host.node import cri_pb2_grpc as cri_grpc
from guestagent.transport.address import UnixAddress, grpc_target, parse_address


def cri_target(endpoint: str) -> str:
    """A CRI endpoint as kata-monitor takes it: unix:///path, or a bare path."""
    address = parse_address(endpoint if "://" in endpoint else f"unix://{endpoint}")
    if not isinstance(address, UnixAddress):
        raise ValueError(f"CRI endpoint {endpoint!r} is not a unix socket")
    return grpc_target(address)


def pod_names(response: cri.ListPodSandboxResponse) -> dict[str, tuple[str, str]]:
    """sandbox id: (pod name, namespace)."""
    return {pod.id: (pod.metadata.name, pod.metadata.namespace) for pod in response.items}


class PodNames:
    """The CRI's names for sandboxes, kept until their sandbox goes."""

    def __init__(self, endpoint: str, timeout: float) -> None:
        self.timeout = timeout
        self.channel = grpc.insecure_channel(cri_target(endpoint))
        self.stub = cri_grpc.RuntimeServiceStub(self.channel)
        self.names: dict[str, tuple[str, str]] = {}

    def refresh(self, wanted: Iterable[str]) -> None:
        """Ask the CRI again if one of `wanted` is unnamed; forget the ids not wanted."""
        wanted = set(wanted)
        self.names = {k: v for k, v in self.names.items() if k in wanted}
        if wanted <= set(self.names):
            return
        ready = cri.PodSandboxStateValue(state=cri.SANDBOX_READY)
        request = cri.ListPodSandboxRequest(filter=cri.PodSandboxFilter(state=ready))
        response = self.stub.ListPodSandbox(request, timeout=self.timeout)
        found = pod_names(response)
        self.names.update({k: v for k, v in found.items() if k in wanted})

    def close(self) -> None:
        self.channel.close()
