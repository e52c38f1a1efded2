"""A stand-in for Cloud Hypervisor's and Firecracker's hybrid vsock socket: a unix socket
that takes "CONNECT <port>\\n", answers, and then carries the byte stream to the guest side
(here: to a unix socket, or an echo when there is none)."""

from __future__ import annotations

import contextlib
import socket
import threading


def _copy(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := src.recv(65536):
            dst.sendall(chunk)
        dst.shutdown(socket.SHUT_WR)


def hybrid_vsock_server(
    path: str, reply: bytes, upstream: str | None = None, connections: int = 1
) -> socket.socket:
    """Answers `connections` CONNECTs with reply (a refusing VMM is dialled again by grpc's
    reconnects: give it more), then accepts no more."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()

    def serve_all() -> None:
        for _ in range(connections):
            try:
                conn, _ = server.accept()
            except OSError:  # Closed by the test.
                return
            serve(conn)

    def serve(conn: socket.socket) -> None:
        line = b""
        while not line.endswith(b"\n"):
            line += conn.recv(1)
        assert line == b"CONNECT 1024\n"
        conn.sendall(reply)
        with conn:
            if not reply.startswith(b"OK"):
                return
            if upstream is None:
                _copy(conn, conn)
                return
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as guest:
                guest.connect(upstream)
                back = threading.Thread(target=_copy, args=(guest, conn), daemon=True)
                back.start()
                _copy(conn, guest)
                back.join()

    threading.Thread(target=serve_all, daemon=True).start()
    return server
