"""A byte relay between sockets: one thread and one epoll for every connection.

The agent relays vsock to its own gRPC unix socket (PyPI's grpcio cannot listen on vsock),
and the host client does the mirror image. A thread per direction per connection would cost
two threads and their stacks for every connection a runtime opens, so one loop multiplexes
them all. Bytes move with splice(2) through a pipe per direction (never copied into Python);
a socket family that cannot splice falls back to a buffer, per direction.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from guestagent.jsonlog import EventLog, Repeats
from guestagent.records import record

log = EventLog("guestagent.relay")
# Failures that repeat with the load (an accept failing for want of descriptors) log one line
# with a count per interval: 1.2 million lines in 20 s filled a disk before.
repeats = Repeats(log)

CHUNK = 256 * 1024
_AGAIN = (errno.EAGAIN, errno.EWOULDBLOCK)
# A reset, or a peer gone, ends the whole connection, not only one direction.
_GONE = (errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN, errno.ESHUTDOWN, errno.ETIMEDOUT)
# A unix listener with a full backlog refuses a non-blocking connect with EAGAIN, and nothing
# signals when it has room again, so the connect is retried after these growing delays.
RETRY_FIRST_SECONDS = 0.001
RETRY_MAX_SECONDS = 0.05
# An accept that failed for want of descriptors or memory pauses the listener for these
# growing delays (the backlog holds callers meanwhile) instead of spinning on it.
PAUSE_FIRST_SECONDS = 0.01
PAUSE_MAX_SECONDS = 1.0
_OUT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# Descriptors one relayed connection holds in this process: the caller's socket, the
# upstream socket, a pipe (two ends) per direction; the gRPC server's end adds one more
# when it runs in the same process (docs/design-transport.md has the measurement).
FDS_PER_CONNECTION = 6


class ConnectionBudget:
    """How many connections the relays of one process may hold at once, shared by them; the
    surplus is accepted and closed at once, so its caller hears so instead of hanging."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._used = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self._used >= self.limit:
                return False
            self._used += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self._used -= 1


class _Direction:
    """Bytes from src to dst: spliced into a pipe, then out of it (or through a buffer when
    src cannot splice: sock_splice_read is EINVAL for families without splice_read)."""

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src, self.dst = src, dst
        self.read_end, self.write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # A smaller pipe only means more splice calls.
            fcntl.fcntl(self.write_end, fcntl.F_SETPIPE_SZ, CHUNK)
        self.capacity = fcntl.fcntl(self.write_end, fcntl.F_GETPIPE_SZ)
        self.pending = 0  # Bytes read from src, not yet written to dst.
        self.buffer: bytearray | None = None
        self.eof = False  # src has ended: dst gets SHUT_WR once pending is written.
        self.done = False

    @property
    def wants_read(self) -> bool:
        return not self.eof and self.pending < self.capacity

    @property
    def wants_write(self) -> bool:
        return self.pending > 0

    def read(self) -> None:
        try:
            if self.buffer is None:
                moved = self._splice_in()
            else:
                chunk = self.src.recv(self.capacity - self.pending)
                self.buffer += chunk
                moved = len(chunk)
        except BlockingIOError:
            return
        self.pending += moved
        if moved == 0:
            self.eof = True
            self._finish_if_drained()

    def _splice_in(self) -> int:
        flags = os.SPLICE_F_NONBLOCK | os.SPLICE_F_MOVE
        try:
            return os.splice(
                self.src.fileno(), self.write_end, self.capacity - self.pending, flags=flags
            )
        except OSError as e:
            if e.errno in _AGAIN:
                raise BlockingIOError from e
            if e.errno != errno.EINVAL or self.pending:
                raise
        # This socket cannot splice; nothing is in the pipe yet, so switch to a buffer.
        self.buffer = bytearray()
        chunk = self.src.recv(self.capacity)
        self.buffer += chunk
        return len(chunk)

    def write(self) -> None:
        try:
            if self.buffer is None:
                flags = os.SPLICE_F_NONBLOCK | os.SPLICE_F_MOVE
                moved = os.splice(self.read_end, self.dst.fileno(), self.pending, flags=flags)
            else:
                moved = self.dst.send(self.buffer)
                del self.buffer[:moved]
        except BlockingIOError:
            return
        except OSError as e:
            if e.errno in _AGAIN:
                return
            raise
        self.pending -= moved
        self._finish_if_drained()

    def _finish_if_drained(self) -> None:
        if self.eof and self.pending == 0 and not self.done:
            self.done = True
            with contextlib.suppress(OSError):
                self.dst.shutdown(socket.SHUT_WR)  # The far side sees EOF too.

    def abandon(self) -> None:
        """dst is gone: what is pending can never arrive, and nothing more is read."""
        self.eof = self.done = True
        self.pending = 0

    def close(self) -> None:
        os.close(self.read_end)
        os.close(self.write_end)


class _Connection:
    def __init__(
        self, a: socket.socket, b: socket.socket, release: Callable[[], None] | None
    ) -> None:
        self.sockets = (a, b)
        self.release = release
        forward = _Direction(a, b)
        try:
            back = _Direction(b, a)
        except OSError:
            forward.close()  # Out of descriptors for the second pipe: free the first.
            raise
        self.forward, self.back = forward, back
        # The epoll mask each socket is registered with; None once it is unregistered.
        self.masks: dict[int, int | None] = {a.fileno(): 0, b.fileno(): 0}

    def directions(self, sock: socket.socket) -> tuple[_Direction, _Direction]:
        """(from sock, to sock)."""
        return (self.forward, self.back) if sock is self.sockets[0] else (self.back, self.forward)

    def mask_of(self, sock: socket.socket) -> int:
        outgoing, incoming = self.directions(sock)
        return (select.EPOLLIN if outgoing.wants_read else 0) | (
            select.EPOLLOUT if incoming.wants_write else 0
        )

    def on_event(self, sock: socket.socket, events: int) -> bool:
        """Move what can move. True if sock is hung up for good and must leave the epoll:
        epoll reports EPOLLHUP whatever the mask, so keeping it would spin the loop."""
        outgoing, incoming = self.directions(sock)
        if events & select.EPOLLERR:
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) or errno.EPIPE
            raise OSError(code, os.strerror(code))
        if events & select.EPOLLOUT and incoming.wants_write:
            incoming.write()
        if events & (select.EPOLLIN | select.EPOLLHUP) and outgoing.wants_read:
            outgoing.read()
            if outgoing.wants_write:  # The other side can usually take it at once.
                outgoing.write()
        if events & select.EPOLLHUP and outgoing.eof:
            incoming.abandon()
            return True
        return False

    @property
    def finished(self) -> bool:
        return self.forward.done and self.back.done

    def close(self) -> None:
        for part in (self.forward, self.back):
            part.close()
        for sock in self.sockets:
            sock.close()
        if self.release is not None:
            self.release()


@record
class Upstream:
    """The far side for an admitted caller, and what to call when the pair closes.

    With an address, sock is not connected yet: the relay connects it without blocking its
    loop. Without one, sock is connected already.
    """

    sock: socket.socket
    release: Callable[[], None] | None = None
    address: Any = None


class _Dial:
    """An admitted caller whose upstream has not answered yet."""

    def __init__(self, conn: socket.socket, peer: Any, upstream: Upstream) -> None:
        self.conn, self.peer, self.upstream = conn, peer, upstream
        self.retry_at: float | None = None  # Set while the upstream's backlog is full.
        self.delay = RETRY_FIRST_SECONDS

    def close(self) -> None:
        self.conn.close()
        self.upstream.sock.close()
        if self.upstream.release is not None:
            self.upstream.release()


class SocketRelay:
    """Accepts on a listener and joins each admitted connection to a freshly dialled one.

    An upstream with an address (the agent's own unix socket) is connected without
    blocking, so a slow upstream holds up only its own caller. The `dial` callable blocks
    the loop: the host client uses it for vsock and hybrid vsock (a CONNECT exchange after
    the connect), and has one caller. A subclass that opens its upstreams itself (overriding
    open_upstream, as the agent's NamedRelay does) passes none.
    """

    def __init__(
        self,
        listener: socket.socket,
        dial: Callable[[], socket.socket] | None = None,
        admit: Callable[[Any], bool] = lambda peer: True,
        name: str = "relay",
        budget: ConnectionBudget | None = None,
        on_dial_failed: Callable[[OSError], None] | None = None,
    ) -> None:
        """on_dial_failed, when given, hears why `dial` failed instead of the log: a command
        line tool that logs nothing reports it to its user (the caller only sees its
        connection closed)."""
        self.listener = listener
        self._on_dial_failed = on_dial_failed
        self._budget = budget
        self._paused_until: float | None = None  # Accepting paused (EMFILE) until then.
        self._pause = PAUSE_FIRST_SECONDS
        self._dial = dial
        self._admit = admit
        self._name = name
        self._epoll = select.epoll()
        self._wake_read, self._wake_write = os.pipe2(os.O_CLOEXEC)
        self._by_fd: dict[int, tuple[_Connection, socket.socket]] = {}
        self._dials: dict[int, _Dial] = {}  # By the caller's fd.
        self._connecting: dict[int, _Dial] = {}  # By the upstream's fd, until EPOLLOUT.
        self._accepting = True
        self._stopped_accepting = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    @property
    def connections(self) -> int:
        """Connections being relayed now (read from another thread: a snapshot)."""
        return len(self._by_fd) // 2

    @property
    def dialling(self) -> int:
        """Callers waiting for their upstream to answer (a snapshot, as connections is)."""
        return len(self._dials)

    def start(self) -> SocketRelay:
        self._epoll.register(self.listener.fileno(), select.EPOLLIN)
        self._epoll.register(self._wake_read, select.EPOLLIN)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting. Connections already relayed run on until their peers end them, so
        a call in flight at shutdown still gets its answer; then the loop ends."""
        with contextlib.suppress(OSError):  # The loop has already ended.
            os.write(self._wake_write, b"x")
        self._stopped_accepting.wait(timeout=5)

    def _loop(self) -> None:
        try:
            while self._accepting or self._by_fd or self._dials:
                for fd, events in self._epoll.poll(self._until_retry()):
                    try:
                        self._dispatch(fd, events)
                    except Exception as e:  # One connection's bug must not end every other.
                        repeats.warning("relay_event_failed", relay=self._name, error=repr(e))
                        self._discard(fd)
                self._retry_due()
                self._resume_due()
        finally:
            for connection in {connection for connection, _ in self._by_fd.values()}:
                connection.close()
            self._by_fd.clear()
            for dial in self._dials.values():
                dial.close()
            self._dials.clear()
            self._connecting.clear()
            self._epoll.close()
            os.close(self._wake_read)
            os.close(self._wake_write)

    def _dispatch(self, fd: int, events: int) -> None:
        if fd == self._wake_read:
            self._stop_accepting()
        elif fd == self.listener.fileno() and self._accepting:
            self._accept()
        elif fd in self._by_fd:
            self._service(fd, events)
        elif fd in self._dials:
            self._caller_left(self._dials[fd])
        elif fd in self._connecting:
            self._connected(self._connecting[fd])

    def _discard(self, fd: int) -> None:
        """After an unexpected failure: drop whatever fd belongs to."""
        with contextlib.suppress(Exception):
            if fd in self._by_fd:
                self._drop(self._by_fd[fd][0])
            elif fd in self._dials:
                self._caller_left(self._dials[fd])
            elif fd in self._connecting:
                self._dial_failed(self._connecting[fd], errno.EIO)

    def _pause_accepting(self) -> None:
        self._paused_until = time.monotonic() + self._pause
        self._pause = min(self._pause * 2, PAUSE_MAX_SECONDS)
        self._epoll.modify(self.listener.fileno(), 0)

    def _resume_due(self) -> None:
        if self._paused_until is not None and self._paused_until <= time.monotonic():
            self._paused_until = None
            if self._accepting:
                self._epoll.modify(self.listener.fileno(), select.EPOLLIN)

    def _stop_accepting(self) -> None:
        self._epoll.unregister(self._wake_read)
        self._epoll.unregister(self.listener.fileno())
        self.listener.close()
        self._accepting = False
        self._stopped_accepting.set()

    def _accept(self) -> None:
        try:
            conn, peer = self.listener.accept()
        except OSError as e:
            repeats.warning("relay_accept_failed", relay=self._name, errno=e.errno, error=str(e))
            if e.errno in _OUT_OF:
                self._pause_accepting()
            return
        self._pause = PAUSE_FIRST_SECONDS
        if not self._admit(peer):
            conn.close()
            return
        if self._budget is not None and not self._budget.take():
            conn.close()  # The caller sees the connection closed, at once.
            repeats.warning(
                "relay_connection_refused",
                relay=self._name,
                reason=f"{self._budget.limit} connections held (--max-connections)",
            )
            return
        try:
            upstream = self._with_budget(self.open_upstream(conn, peer))
        except OSError as e:
            if self._on_dial_failed is not None:
                self._on_dial_failed(e)
            else:
                repeats.warning("relay_dial_failed", relay=self._name, peer=str(peer), error=str(e))
            conn.close()
            if self._budget is not None:
                self._budget.give_back()
            return
        if upstream.address is None:
            self._join(conn, upstream)
            return
        dial = _Dial(conn, peer, upstream)
        upstream.sock.setblocking(False)
        # Mask 0: epoll still reports the caller hanging up while its upstream is dialled.
        self._epoll.register(conn.fileno(), 0)
        self._dials[conn.fileno()] = dial
        self._connect(dial)

    def _with_budget(self, upstream: Upstream) -> Upstream:
        """The upstream whose release also gives its connection back to the budget."""
        budget, release = self._budget, upstream.release
        if budget is None:
            return upstream

        def released() -> None:
            if release is not None:
                release()
            budget.give_back()

        return replace(upstream, release=released)

    def open_upstream(self, conn: socket.socket, peer: Any) -> Upstream:
        """The far side for an admitted caller: `dial`'s socket, connected already."""
        if self._dial is None:
            raise TypeError(f"{type(self).__name__} has no dial and does not open upstreams")
        return Upstream(self._dial())

    def _connect(self, dial: _Dial) -> None:
        """One non-blocking connect: done, in progress (EPOLLOUT will say), or retried."""
        sock = dial.upstream.sock
        try:
            code = sock.connect_ex(dial.upstream.address)
        except OSError as e:
            code = e.errno or errno.EINVAL
        if code in (0, errno.EISCONN):
            self._joined(dial)
        elif code == errno.EINPROGRESS:
            self._epoll.register(sock.fileno(), select.EPOLLOUT)
            self._connecting[sock.fileno()] = dial
        elif code in _AGAIN:
            dial.retry_at = time.monotonic() + dial.delay
            dial.delay = min(dial.delay * 2, RETRY_MAX_SECONDS)
        else:
            self._dial_failed(dial, code)

    def _caller_left(self, dial: _Dial) -> None:
        """The caller hung up (or failed) before its upstream answered."""
        self._end_dial(dial)
        dial.close()

    def _connected(self, dial: _Dial) -> None:
        """EPOLLOUT after EINPROGRESS: SO_ERROR says whether the connect succeeded."""
        code = dial.upstream.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self._dial_failed(dial, code)
        else:
            self._joined(dial)

    def _until_retry(self) -> float | None:
        """Seconds until the next connect or the listener's resume is due; None: neither."""
        due = [d.retry_at for d in self._dials.values() if d.retry_at is not None]
        if self._paused_until is not None:
            due.append(self._paused_until)
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _retry_due(self) -> None:
        now = time.monotonic()
        for dial in list(self._dials.values()):
            if dial.retry_at is not None and dial.retry_at <= now:
                dial.retry_at = None
                self._connect(dial)

    def _end_dial(self, dial: _Dial) -> None:
        del self._dials[dial.conn.fileno()]
        self._epoll.unregister(dial.conn.fileno())
        if self._connecting.pop(dial.upstream.sock.fileno(), None) is not None:
            self._epoll.unregister(dial.upstream.sock.fileno())

    def _dial_failed(self, dial: _Dial, code: int) -> None:
        self._end_dial(dial)
        repeats.warning(
            "relay_dial_failed",
            relay=self._name,
            peer=str(dial.peer),
            errno=code,
            error=os.strerror(code),
        )
        dial.close()

    def _joined(self, dial: _Dial) -> None:
        self._end_dial(dial)
        self._join(dial.conn, dial.upstream)

    def _join(self, conn: socket.socket, upstream: Upstream) -> None:
        try:
            connection = _Connection(conn, upstream.sock, upstream.release)
        except OSError as e:  # No descriptors for its pipes: shed this one connection.
            repeats.warning("relay_connection_shed", relay=self._name, errno=e.errno, error=str(e))
            conn.close()
            upstream.sock.close()
            if upstream.release is not None:
                upstream.release()
            return
        for sock in connection.sockets:
            sock.setblocking(False)
            self._by_fd[sock.fileno()] = (connection, sock)
            self._epoll.register(sock.fileno(), 0)
        self._update(connection)

    def _service(self, fd: int, events: int) -> None:
        connection, sock = self._by_fd[fd]
        try:
            hung_up = connection.on_event(sock, events)
        except OSError as e:
            if e.errno not in _GONE:
                log.warning("relay_failed", relay=self._name, errno=e.errno, error=str(e))
            self._drop(connection)
            return
        if hung_up:
            self._epoll.unregister(fd)
            connection.masks[fd] = None
        if connection.finished:
            self._drop(connection)
        else:
            self._update(connection)

    def _update(self, connection: _Connection) -> None:
        for sock in connection.sockets:
            registered = connection.masks[sock.fileno()]
            mask = connection.mask_of(sock)
            if registered is not None and mask != registered:
                self._epoll.modify(sock.fileno(), mask)
                connection.masks[sock.fileno()] = mask

    def _drop(self, connection: _Connection) -> None:
        for sock in connection.sockets:
            if connection.masks[sock.fileno()] is not None:
                self._epoll.unregister(sock.fileno())
            del self._by_fd[sock.fileno()]
        connection.close()
