#!/usr/bin/python3
"""Test-only command channel: run commands the test harness sends over virtio-serial.

Each request is one JSON line, {"id": any, "argv": [...]} or {"id": any, "sh": "..."}, with
optional "timeout" (seconds) and "stdin" (str); each answer is one JSON line
{"id", "rc", "stdout", "stderr", "timed_out"}. Requests run one at a time. Started by the
guest init only when the kernel command line has guestagent.testexec=1; the agent never runs
commands for its callers.
"""

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

PORT = "/dev/virtio-ports/guestagent.testexec"
# A virtio-serial read returns EOF while no host is connected; poll for one at this interval.
RECONNECT_POLL_SECONDS = 0.2


def failure(rc: int, message: str) -> dict[str, Any]:
    return {"rc": rc, "stdout": "", "stderr": f"testexec: {message}\n", "timed_out": False}


def run(request: dict[str, Any]) -> dict[str, Any]:
    shell = "sh" in request
    try:
        # A session of its own lets a timeout kill the whole pipeline, not just the shell.
        process = subprocess.Popen(
            request["sh"] if shell else request["argv"],
            shell=shell,
            start_new_session=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as error:
        return failure(127, str(error))
    stdin = request.get("stdin", "").encode()
    try:
        stdout, stderr = process.communicate(stdin, timeout=request.get("timeout", 60))
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        timed_out = True
    return {
        "rc": process.returncode,
        "stdout": stdout.decode(errors="replace"),
        "stderr": stderr.decode(errors="replace"),
        "timed_out": timed_out,
    }


def answer(line: bytes) -> bytes:
    try:
        request = json.loads(line)
        response = run(request)
    except (ValueError, KeyError, TypeError) as error:
        request, response = {}, failure(126, f"bad request: {error!r}")
    response["id"] = request.get("id")
    return json.dumps(response).encode() + b"\n"


def serve_connection(port: int) -> None:
    """Answer requests until the host disconnects; a partial request is dropped with it."""
    pending = b""
    while chunk := os.read(port, 65536):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            reply = memoryview(answer(line))
            while reply:
                reply = reply[os.write(port, reply) :]


def main() -> None:
    while True:
        try:
            port = os.open(PORT, os.O_RDWR)
        except OSError as error:
            print(f"testexec: cannot open {PORT}: {error}", file=sys.stderr, flush=True)
            time.sleep(1)
            continue
        try:
            serve_connection(port)
        except OSError as error:
            print(f"testexec: {PORT}: {error}", file=sys.stderr, flush=True)
        finally:
            os.close(port)
        time.sleep(RECONNECT_POLL_SECONDS)


if __name__ == "__main__":
    main()
