"""The Host check: a request must name an address this server listens on.

A web page can make the browser resolve its own name to 127.0.0.1 (DNS rebinding) and
then talk to a local server as a same-origin page; only the Host header, which still
carries the page's name, gives it away. So the Host header must be one of:
- the --host value itself;
- for a loopback bind: localhost, 127.0.0.1 or ::1;
- for a wildcard bind (0.0.0.0, ::): any IP literal (rebinding needs a name), localhost
  and this machine's host name;
- for a bind to a name: the addresses that name resolved to at start;
- a name --allow-host gives (`*.example.com` matches its subdomains; `*` turns the check off,
  e.g. behind a reverse proxy that checks Host itself).
The port, when present, is not compared (the socket already decided it). A request with
no Host header passes: browsers always send one, so it cannot be a rebinding.
A refusal is a 400 `invalid_host` (as Starlette's TrustedHostMiddleware and Django answer),
not a 421: 421 tells a client to retry on another connection, and no connection helps.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from strata.errors import ConfigError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("", "0.0.0.0", "::")


def split_host(value: str) -> str | None:
    """The host part of a Host header (lower case, IPv6 without brackets), None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        host, rest = value[1:end], value[end + 1 :]
        if end < 0 or not _is_ip(host):
            return None
    elif value.count(":") > 1:
        return None  # a bare IPv6 address must be in brackets
    else:
        host, colon, port = value.partition(":")
        rest = colon + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit()):
        return None
    host = host.removesuffix(".")
    return host or None


def normalise_allowed_host(value: str) -> str:
    """An --allow-host value: `*`, `*.domain`, a name or an IP address (no port)."""
    text = value.strip().lower()
    if text == "*":
        return text
    bare = text[2:] if text.startswith("*.") else text
    bare = bare[1:-1] if bare.startswith("[") and bare.endswith("]") else bare
    if _is_ip(bare) and not text.startswith("*."):
        return bare
    if not bare or not all(part and _is_label(part) for part in bare.removesuffix(".").split(".")):
        raise ConfigError(
            f"--allow-host must be a host name, an IP address, '*.domain' or '*', got {value!r}"
        )
    return ("*." if text.startswith("*.") else "") + bare.removesuffix(".")


def _is_label(part: str) -> bool:
    return len(part) <= 63 and part.replace("-", "").replace("_", "").isalnum() and part.isascii()


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class HostPolicy:
    names: frozenset[str]  # exact host names and IP literals, lower case
    suffixes: tuple[str, ...] = ()  # ".example.com" from "*.example.com"
    any_ip: bool = False
    any_host: bool = False

    @classmethod
    def for_bind(cls, bind: str, allowed: tuple[str, ...] = ()) -> HostPolicy:
        bind = bind.strip().lower().strip("[]")
        names = {bind} if bind not in WILDCARD_BINDS else set()
        any_ip = bind in WILDCARD_BINDS
        if bind == "localhost" or (_is_ip(bind) and ipaddress.ip_address(bind).is_loopback):
            names.update(LOOPBACK_NAMES)
        elif any_ip:
            names.update({"localhost", socket.gethostname().lower()})
        elif not _is_ip(bind):
            names.update(_resolved(bind))
        patterns = [normalise_allowed_host(a) for a in allowed]
        names.update(p for p in patterns if not p.startswith("*"))
        suffixes = tuple(p[1:] for p in patterns if p.startswith("*."))
        return cls(frozenset(names), suffixes, any_ip, "*" in patterns)

    def allows(self, host_header: str) -> bool:
        if self.any_host:
            return True
        host = split_host(host_header)
        if host is None:
            return False
        if host in self.names or (self.any_ip and _is_ip(host)):
            return True
        return any(host.endswith(suffix) for suffix in self.suffixes)


def _resolved(name: str) -> set[str]:
    try:
        return {info[4][0].lower() for info in socket.getaddrinfo(name, None)}
    except (OSError, UnicodeError):
        return set()  # uvicorn will fail to bind it anyway
