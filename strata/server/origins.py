"""The Origin check: browsers say which site a request comes from; other sites are refused.

Any web page can send requests to a server on the user's machine (`fetch` with
`mode: "no-cors"` needs no preflight for a form-typed POST); the browser then marks the
request with an `Origin` header. A request that carries one passes only when it is
- the server's own origin (its scheme://host[:port] names the Host header the request was
  sent to, which the Host check has already accepted), or
- named by --allow-origin (`*` names every origin).
Anything else, `null` included (sandboxed frames, files), is a 403 `origin_not_allowed`,
preflights too, before the API key or the body is looked at. Requests without an Origin
(curl, SDKs, servers) are not browser requests from another site and pass.
Allowed origins get CORS headers from Starlette's CORSMiddleware, placed after this check.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from strata.errors import ConfigError

DEFAULT_PORTS = {"http": "80", "https": "443"}


def parse_origin(value: str) -> str | None:
    """`scheme://host[:port]` in lower case without a default port; None if not an origin."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in DEFAULT_PORTS or not parts.hostname:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return None
    if parts.password is not None or parts.netloc.endswith(":"):
        return None
    scheme, host = parts.scheme.lower(), parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    shown_port = "" if port is None or str(port) == DEFAULT_PORTS[scheme] else f":{port}"
    return f"{scheme}://{host}{shown_port}"


def normalise_allowed_origin(value: str) -> str:
    """An --allow-origin value: `*` or `scheme://host[:port]` (http or https, no path)."""
    if value.strip() == "*":
        return "*"
    origin = parse_origin(value)
    if origin is None:
        raise ConfigError(
            f"--allow-origin must be '*' or an origin like https://app.example:8443 "
            f"(http or https, no path), got {value!r}"
        )
    return origin


@dataclass(frozen=True)
class OriginPolicy:
    allowed: frozenset[str]  # normalised origins, or {"*"}

    def allows(self, origin: str, host_header: str | None) -> bool:
        if "*" in self.allowed:
            return True
        parsed = parse_origin(origin)
        if parsed is None:
            return False
        if parsed in self.allowed:
            return True
        # Same origin: the page was served by this server, under the name the request used.
        if host_header is None:
            return False
        own = {parse_origin(f"{scheme}://{host_header}") for scheme in DEFAULT_PORTS}
        return parsed in own
