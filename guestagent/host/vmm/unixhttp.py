"""HTTP/1.1 on a unix socket, as Cloud Hypervisor's and Firecracker's APIs speak it (JSON) and
Kata's shims serve their monitor (text).

A request per connection, its answer read by Content-Length, chunks, or to the close, the
status line and headers at most 64 KiB and the body at most 4 MiB, all within the timeout.
Not http.client: it brings email and half of http with it (with http.server, 1.6 MiB of the
node daemon's memory; docs/measurements.md). The peer's pid comes from the socket's
credentials, as for QEMU's monitor, so the VMM's RSS can be read.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

from guestagent.host.vmm.base import VmmError

HEAD_LIMIT = 64 * 1024  # The status line and headers.
BODY_LIMIT = 4 * 1024 * 1024  # Both VMMs' vm.info and a shim's text are a few KiB.
NO_BODY = (204, 304)


class ApiError(Exception):
    """The VMM answered with an error status, or not at all; says which request and why."""


class BadAnswer(Exception):
    """What the peer sent is not an HTTP/1.x answer within the limits; says what."""


class _Reader:
    """The socket's bytes, each read within what is left of the deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline
        self.buffer = bytearray()
        self.closed = False

    def settle(self) -> None:
        """The socket's timeout: what is left of the deadline."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.sock.settimeout(left)

    def _fill(self) -> None:
        self.settle()
        data = self.sock.recv(65536)
        if not data:
            self.closed = True
        self.buffer += data

    def line(self, limit: int) -> bytes:
        """One line without its CRLF (or LF); BadAnswer past `limit` bytes or at the close."""
        while (end := self.buffer.find(b"\n")) < 0:
            if len(self.buffer) > limit:
                raise BadAnswer(f"a line longer than {limit} bytes")
            if self.closed:
                raise BadAnswer("the connection closed mid-answer")
            self._fill()
        if end > limit:
            raise BadAnswer(f"a line longer than {limit} bytes")
        line = bytes(self.buffer[:end]).rstrip(b"\r")
        del self.buffer[: end + 1]
        return line

    def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if self.closed:
                raise BadAnswer(f"the connection closed after {len(self.buffer)} of {size} bytes")
            self._fill()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def to_close(self, limit: int) -> bytes:
        while not self.closed:
            if len(self.buffer) > limit:
                raise BadAnswer(f"a body longer than {limit} bytes")
            self._fill()
        if len(self.buffer) > limit:
            raise BadAnswer(f"a body longer than {limit} bytes")
        return bytes(self.buffer)


def _head(reader: _Reader) -> tuple[int, str, dict[str, str]]:
    """The status, its reason and the headers (names lower-cased) of a final answer: an
    interim 1xx is passed over."""
    while True:
        used = 0
        status_line = reader.line(HEAD_LIMIT)
        version, _, rest = status_line.decode("latin-1").partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise BadAnswer(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        headers: dict[str, str] = {}
        while line := reader.line(HEAD_LIMIT):
            used += len(line)
            if used > HEAD_LIMIT:
                raise BadAnswer(f"headers longer than {HEAD_LIMIT} bytes")
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon:
                raise BadAnswer(f"not a header: {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        if not 100 <= int(code) < 200:
            return int(code), reason.strip(), headers


def _chunked(reader: _Reader) -> bytes:
    body = bytearray()
    while True:
        size_text = reader.line(HEAD_LIMIT).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise BadAnswer(f"not a chunk size: {size_text[:80]!r}") from None
        if size == 0:
            while reader.line(HEAD_LIMIT):  # The trailers, if any.
                pass
            return bytes(body)
        if len(body) + size > BODY_LIMIT:
            raise BadAnswer(f"a body longer than {BODY_LIMIT} bytes")
        body += reader.exactly(size)
        if reader.line(HEAD_LIMIT):
            raise BadAnswer("a chunk longer than its size")


def _body(reader: _Reader, method: str, status: int, headers: dict[str, str]) -> bytes:
    if method == "HEAD" or status in NO_BODY:
        return b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _chunked(reader)
    length = headers.get("content-length")
    if length is None:
        return reader.to_close(BODY_LIMIT)
    if not length.isdigit():
        raise BadAnswer(f"not a Content-Length: {length[:80]!r}")
    if int(length) > BODY_LIMIT:
        raise BadAnswer(f"a body of {length} bytes, more than {BODY_LIMIT}")
    return reader.exactly(int(length))


def exchange(
    path: str, timeout: float, method: str, url: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, str, bytes]:
    """One request on a connection of its own: the answer's status, reason and body, all
    within `timeout`. TimeoutError, OSError or BadAnswer otherwise."""
    deadline = time.monotonic() + timeout
    lines = [f"{method} {url} HTTP/1.1", "Host: localhost", "Accept-Encoding: identity"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        reader = _Reader(sock, deadline)
        reader.settle()
        sock.sendall(request)
        status, reason, answer_headers = _head(reader)
        return status, reason, _body(reader, method, status, answer_headers)


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
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        try:
            status, reason, raw = exchange(self.path, self.timeout, method, url, payload, headers)
        except TimeoutError:
            late = f"no answer from {self.path} within {self.timeout:g} s"
            raise ApiError(f"{what}: {late}") from None
        except (OSError, BadAnswer) as e:
            raise ApiError(f"{what}: {self.path}: {e}") from None
        text = raw.decode(errors="replace")
        if status >= 300:
            raise ApiError(f"{what}: HTTP {status} {reason}: {text.strip()}")
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
