"""HTTP/1.1 on a unix socket, as Cloud Hypervisor's and Firecracker's APIs speak it (JSON) and
Kata's shims serve their monitor (text).

The standard library's http.client with its connect pointed at the socket; the peer's pid
comes from the socket's credentials, as for QEMU's monitor, so the VMM's RSS can be read.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
from typing import Any

from guestagent.host.vmm.base import VmmError


class ApiError(Exception):
    """The VMM answered with an error status, or not at all; says which request and why."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def peer_pid(path: str, timeout: float) -> int:
    """The pid of the process listening on the unix socket at path; VmmError naming the path
    when nothing answers there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except TimeoutError:
            raise VmmError(f"{path}: no answer within {timeout:g} s") from None
        except OSError as e:
            raise VmmError(f"{path}: {e.strerror or e}") from None
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid: int = struct.unpack("3i", creds)[0]
    return pid


class UnixHttpClient:
    """One request per connection: both VMMs' API servers serve a request at a time, and a
    connection left open would hold one of their few slots between a follow loop's polls."""

    def __init__(self, path: str, timeout: float, prefix: str = "") -> None:
        self.path = path
        self.timeout = timeout
        self.prefix = prefix

    def text(self, method: str, endpoint: str, body: dict[str, Any] | None = None) -> str:
        """The answer's body as text; ApiError on a status >= 300, quoting the body (a Kata
        shim's error text is all it says)."""
        url = self.prefix + endpoint
        what = f"{method} {url}" + (f" {json.dumps(body)}" if body is not None else "")
        connection = _UnixConnection(self.path, self.timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json"}
            if payload is not None:
                headers["Content-Type"] = "application/json"
            connection.request(method, url, body=payload, headers=headers)
            response = connection.getresponse()
            text = response.read().decode(errors="replace")
        except TimeoutError:
            late = f"no answer from {self.path} within {self.timeout:g} s"
            raise ApiError(f"{what}: {late}") from None
        except (OSError, http.client.HTTPException) as e:
            raise ApiError(f"{what}: {self.path}: {e}") from None
        finally:
            connection.close()
        if response.status >= 300:
            raise ApiError(f"{what}: HTTP {response.status} {response.reason}: {text.strip()}")
        return text

    def request(self, method: str, endpoint: str, body: dict[str, Any] | None = None) -> Any:
        """The decoded JSON answer (None for an empty one); ApiError on a status >= 300."""
        text = self.text(method, endpoint, body)
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            what = f"{method} {self.prefix}{endpoint}"
            raise ApiError(f"{what}: not JSON ({e}): {text[:200]!r}") from None


class RestVmm:
    """A VMM over its REST API (Cloud Hypervisor, Firecracker): both size the balloon by what
    it takes, and an error from the API is a VmmError that names the VMM."""

    name: str
    title: str  # The VMM as its errors name it.
    prefix = ""  # Before every endpoint.
    balloon_leaves = False

    def __init__(self, path: str, timeout: float) -> None:
        self.api = UnixHttpClient(path, timeout, self.prefix)
        self.pid = peer_pid(path, timeout)

    def _call(self, method: str, endpoint: str, body: dict[str, Any] | None = None) -> Any:
        try:
            return self.api.request(method, endpoint, body)
        except ApiError as e:
            raise VmmError(f"{self.title}: {e}") from None

    def close(self) -> None:
        """Nothing held: each request has its own connection."""
