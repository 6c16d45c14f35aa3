"""Ports for servers a test cannot hand a bound socket to.

`strata serve` takes one (`--fd`, see tests/server/test_slots.py). Ray Serve's HTTP proxy
binds its port itself, in a process of Ray's; it sets SO_REUSEPORT (Serve's default). So
`held_port` binds a loopback port with SO_REUSEPORT and keeps that socket, never listening
(a socket that does not listen takes no connection), for as long as the proxy runs: the
proxy binds the same port beside it, and no program without SO_REUSEPORT as this user can
take the port meanwhile (the kernel's port 0 never picks it either).
"""

from __future__ import annotations

import socket
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
