"""Ports for servers a test cannot hand a bound socket to, and waiting for a server process.

`strata serve` takes one (`--fd`, see tests/server/test_slots.py). Ray Serve's HTTP proxy
binds its port itself, in a process of Ray's; it sets SO_REUSEPORT (Serve's default). So
`held_port` binds a loopback port with SO_REUSEPORT and keeps that socket, never listening
(a socket that does not listen takes no connection), for as long as the proxy runs: the
proxy binds the same port beside it, and no program without SO_REUSEPORT as this user can
take the port meanwhile (the kernel's port 0 never picks it either).
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def held_port(host: str = "127.0.0.1") -> Iterator[int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, 0))
        yield sock.getsockname()[1]
    finally:
        sock.close()


def wait_serving(base: str, proc: subprocess.Popen, what: str, path: str = "/health",
                 timeout_s: float = 300.0) -> None:
    """Until `GET base + path` answers 200; fails at once with the process's stderr if it
    exited, or after `timeout_s` saying `what` never served."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if httpx.get(f"{base}{path}", timeout=10).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{what} never served"
        time.sleep(0.1)
