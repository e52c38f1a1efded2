#!/usr/bin/python3
"""Test-only stand-in for a VM's init agent (kata-agent, vminitd): holds a vsock port, as they
hold 1024, and answers every connection with one line naming itself, then closes it.

Usage: guestagent-standin PORT. It returns once the port is bound and keeps serving in a child
process, so whoever starts it knows the port is taken before it starts the next agent.
"""

import os
import socket
import sys

BANNER = b"standin-init-agent\n"


def main() -> None:
    port = int(sys.argv[1])
    server = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    server.bind((socket.VMADDR_CID_ANY, port))
    server.listen()
    if os.fork():
        return
    os.setsid()
    while True:
        connection, _ = server.accept()
        with connection:
            connection.sendall(BANNER)


if __name__ == "__main__":
    main()
