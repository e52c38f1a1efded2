"""A Kata shim's monitor socket, as `kata-runtime exec` uses it: `GET /agent-url` says where
the guest's init agent is (Kata 4.1.0, src/runtime/cmd/kata-runtime/kata-exec.go getConn).
The Go shim answers 500 with its error's text, runtime-rs 200 with an empty body; either is
an AgentUrlError here, and a shim that does not answer within the timeout is one too."""

from __future__ import annotations

from guestagent.host.node.sandboxes import AgentUrlError, agent_address
from guestagent.host.vmm.unixhttp import ApiError, UnixHttpClient


def ask_agent_address(shim_socket: str, port: int, timeout: float, root: str = "/") -> str:
    """This agent's address in the shim's VM: its init agent's, with this agent's port, a
    hybrid vsock's path under `root`."""
    try:
        url = UnixHttpClient(shim_socket, timeout).text("GET", "/agent-url")
    except ApiError as e:
        raise AgentUrlError(f"the shim: {e}") from None
    return agent_address(url, port, root)
