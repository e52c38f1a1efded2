"""Addresses both sides name the agent by: vsock, hybrid vsock, unix and tcp."""

from __future__ import annotations

import socket

from guestagent.errors import InvalidArgument
from guestagent.records import record

HOST_CID = 2  # VMADDR_CID_HOST: the hypervisor side, the only trusted caller.
# 1024 is kata-agent's and vminitd's (1025/1026 are kata's log and debug console, vminitd's
# relays start at 0x10000000); both bind VMADDR_CID_ANY, so the agent takes a port of its own.
DEFAULT_VSOCK_PORT = 6464


@record
class VsockAddress:
    cid: int
    port: int


@record
class HybridVsockAddress:
    """A Cloud Hypervisor / Firecracker vsock: a host unix socket plus a CONNECT handshake."""

    path: str
    port: int


@record
class UnixAddress:
    path: str


@record
class TcpAddress:
    host: str
    port: int

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        # Here, not at the top: any second `import ipaddress` runs the module that the agent's
        # entry defers (load_on_use.py), and only a tcp listener needs it.
        import ipaddress

        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


Address = VsockAddress | HybridVsockAddress | UnixAddress | TcpAddress


def _port(text: str, address: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise InvalidArgument(f"address {address!r}: port {text!r} is not a number") from None
    if not 0 <= port <= 0xFFFFFFFF:
        raise InvalidArgument(f"address {address!r}: port {port} is out of range")
    return port


def parse_address(text: str) -> Address:
    """vsock://CID:PORT (CID may be empty: any), hvsock:///path:PORT, unix:///path, tcp://H:P."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise InvalidArgument(
            f"address {text!r} has no scheme (vsock://, hvsock://, unix://, tcp://)"
        )
    if scheme == "unix":
        if not rest.startswith("/"):
            raise InvalidArgument(f"address {text!r}: unix path must be absolute")
        return UnixAddress(rest)
    if scheme == "hvsock":
        path, colon, port = rest.rpartition(":")
        if not colon or not path.startswith("/"):
            raise InvalidArgument(f"address {text!r}: expected hvsock:///path/to/socket:PORT")
        return HybridVsockAddress(path, _port(port, text))
    host, colon, port = rest.rpartition(":")
    if not colon:
        raise InvalidArgument(f"address {text!r} has no port")
    if scheme == "vsock":
        if host in ("", "-1"):
            return VsockAddress(socket.VMADDR_CID_ANY, _port(port, text))
        return VsockAddress(_port(host, text), _port(port, text))
    if scheme == "tcp":
        if not host:
            raise InvalidArgument(f"address {text!r} has no host")
        tcp_port = _port(port, text)
        if tcp_port > 0xFFFF:
            raise InvalidArgument(f"address {text!r}: tcp port {tcp_port} is out of range")
        return TcpAddress(host.strip("[]"), tcp_port)
    raise InvalidArgument(f"address {text!r}: unknown scheme {scheme!r}")


def grpc_target(address: UnixAddress | TcpAddress) -> str:
    """The string grpcio takes for an address it can reach natively."""
    if isinstance(address, UnixAddress):
        return f"unix://{address.path}"
    host = f"[{address.host}]" if ":" in address.host else address.host
    return f"{host}:{address.port}"
