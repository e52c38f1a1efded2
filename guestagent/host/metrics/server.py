"""/metrics over HTTP, in the foreground or on a thread of its own: what `guestctl metrics`,
`give-back --follow --metrics` and `guestctl node` serve. Each scrape builds the families
then, from what the caller last saw: never a call to a guest, so a slow one delays none.

An asyncio server on a loop of its own, not http.server: that brings socketserver, email
and mimetypes (with http.client, 1.6 MiB of the node daemon's memory; docs/measurements.md).
HTTP/1.0 as http.server answered: one request a connection, then the close; a request's head
is at most 64 KiB and arrives within 10 s, or the connection is dropped.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from collections.abc import Callable, Iterable

from guestagent.host.metrics.exposition import CONTENT_TYPE, exposition
from guestagent.host.metrics.families import Family
from guestagent.transport.address import TcpAddress, grpc_target

Build = Callable[[], Iterable[Family]]
# Says where the server listens: (its URL, what it serves).
Announce = Callable[[str, str], None]
HEAD_LIMIT = 64 * 1024
HEAD_SECONDS = 10.0
CLOSE_GRACE_SECONDS = 1.0  # For the connections in flight at shutdown.
TEXT = "text/plain; charset=utf-8"
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 501: "Not Implemented"}


def _stderr(url: str, what: str) -> None:
    print(f"guestctl: {what} on {url}", file=sys.stderr, flush=True)


def answer(request_line: bytes, build: Build) -> tuple[int, str, bytes]:
    """What a request line gets: (status, content type, body)."""
    parts = request_line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return 400, TEXT, b"not an HTTP request line\n"
    method, target, _ = parts
    if method != "GET":
        return 501, TEXT, f"unsupported method {method[:20]!r}\n".encode()
    path = target.split("?", 1)[0]
    if path in ("/", "/metrics"):
        return 200, CONTENT_TYPE, exposition(build()).encode()
    if path == "/healthz":
        return 200, TEXT, b"ok\n"
    return 404, TEXT, b"/metrics or /healthz\n"


async def _request_line(reader: asyncio.StreamReader) -> bytes:
    """The request line, its headers read past (a GET's body is none of ours)."""
    first = await reader.readuntil(b"\n")
    used = len(first)
    while (line := await reader.readuntil(b"\n")) not in (b"\r\n", b"\n"):
        used += len(line)
        if used > HEAD_LIMIT:
            raise ValueError("request head too long")
    return first.rstrip(b"\r\n")


class MetricsServer:
    """/metrics over HTTP; it says where it listens (on stderr unless told otherwise), `what`
    naming what it serves. serve_forever() runs it in the calling thread until shutdown()
    from another; serve_until_signalled() until a signal."""

    def __init__(
        self, address: TcpAddress, build: Build, what: str, announce: Announce = _stderr
    ) -> None:
        self.build = build
        self._loop = asyncio.new_event_loop()
        self._stopped = threading.Event()
        # An IPv6 address (`[::]:9464`) needs an AF_INET6 socket.
        family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address.host, address.port))
            sock.listen(16)
            start = asyncio.start_server(self._serve, sock=sock, limit=HEAD_LIMIT)
            self._server = self._loop.run_until_complete(start)
        except BaseException:
            sock.close()
            self._loop.close()
            raise
        # The port actually bound: --listen may say 0.
        self.server_port: int = sock.getsockname()[1]
        bound = grpc_target(TcpAddress(address.host, self.server_port))
        announce(f"http://{bound}/metrics", what)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(_request_line(reader), HEAD_SECONDS)
            status, kind, body = answer(line, self.build)
            head = (
                f"HTTP/1.0 {status} {REASONS[status]}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (
            TimeoutError,
            ValueError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
        ):
            pass  # A scraper that went, or a request too slow or too long: dropped.
        except asyncio.CancelledError:
            # Closing: the connection ends here. Not re-raised: Python 3.11's stream callback
            # asks a cancelled task for its exception and prints the CancelledError it gets.
            pass
        finally:
            writer.close()

    def serve_forever(self) -> None:
        self._stopped.clear()
        try:
            self._loop.run_forever()
        finally:
            self._stopped.set()

    def serve_until_signalled(self, signals: tuple[int, ...]) -> None:
        """In the main thread: serve until one of `signals`. The loop stops between two
        callbacks, so a scrape being answered is never cut by the signal (a KeyboardInterrupt
        raised inside a connection's callback is a traceback asyncio prints)."""
        for number in signals:
            self._loop.add_signal_handler(number, self._loop.stop)
        try:
            self.serve_forever()
        finally:
            for number in signals:
                self._loop.remove_signal_handler(number)

    def shutdown(self) -> None:
        """From another thread: serve_forever() has returned when this does."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._stopped.wait()

    async def _close_connections(self) -> None:
        # Every connection's task, not only those seen started: one accepted as the loop
        # stopped has not run yet. Each is let finish (a scrape takes milliseconds) before the
        # rest, a client too slow to ask, are cancelled: a task cancelled before its first step
        # cannot catch it, and Python 3.11's stream callback prints its CancelledError.
        others = asyncio.all_tasks() - {asyncio.current_task()}
        if others:
            _, slow = await asyncio.wait(others, timeout=CLOSE_GRACE_SECONDS)
            for task in slow:
                task.cancel()
            await asyncio.gather(*slow, return_exceptions=True)
        await self._server.wait_closed()

    def server_close(self) -> None:
        """Once serve_forever() has returned: the listener and every connection closed."""
        self._server.close()
        self._loop.run_until_complete(self._close_connections())
        self._loop.close()


def serve_in_background(
    listen: TcpAddress, build: Build, announce: Announce = _stderr
) -> MetricsServer:
    """A metrics server on a thread of its own; the caller closes it with shutdown()."""
    server = MetricsServer(listen, build, "metrics", announce)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
