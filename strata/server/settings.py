"""What `strata serve` was asked for, besides the engine: validated once, before anything starts."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from strata.errors import ConfigError
from strata.loader.default import DEFAULT_FILE
from strata.server.hosts import normalise_allowed_host
from strata.server.origins import normalise_allowed_origin

MIB = 1 << 20
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_MAX_WAITING = 64
DEFAULT_MAX_BODY_BYTES = 8 * MIB
DEFAULT_SSE_KEEPALIVE_S = 10.0
# Requests in flight at once. Above the default lanes + --max-waiting (4 + 64), so a busy
# engine answers `queue_full` first, with room left for /v1/models and /slots; and it
# bounds the bodies being buffered at once to 128 x --max-body-bytes (1 GiB by default).
DEFAULT_MAX_CONNECTIONS = 128
API_KEY_ENV = "STRATA_API_KEY"
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json", "mistral")
REASONING_FORMATS = ("auto", "none")


@dataclass(frozen=True)
class ServerSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    # None: no authentication. Otherwise every route but /health (and the schema and docs)
    # needs `Authorization: Bearer <api_key>`.
    api_key: str | None = None
    # Requests that may wait for a lane while every lane is busy: the server holds at most
    # lanes + max_waiting requests, and one more is a 503 `queue_full` with Retry-After.
    max_waiting: int = DEFAULT_MAX_WAITING
    # A request body larger than this is a 413 before any of it is parsed.
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # The model id clients send and /v1/models lists; None: derived from the model file.
    model_alias: str | None = None
    # A streaming request that has no event for this long gets an SSE comment line; one
    # still waiting for a lane after it starts its stream, so a later refusal arrives as an
    # SSE error event (before that, a refusal is a plain 503). 0 starts every stream at once.
    sse_keepalive_s: float = DEFAULT_SSE_KEEPALIVE_S
    # Requests in flight at once (streams until they end); one more is a 503
    # `too_many_connections` with Retry-After. /health and /metrics are not counted.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # Web origins (scheme://host[:port], or "*") whose pages may call the API (CORS); a
    # request with any other Origin but the server's own is a 403. Normalised here.
    allow_origins: tuple[str, ...] = ()
    # Host header names accepted besides the addresses the server listens on ("*.domain"
    # for subdomains, "*" for any). Normalised here.
    allow_hosts: tuple[str, ...] = ()
    # The one directory POST /slots/{id}?action=save|restore reads and writes session files
    # in (a real path); None: those actions answer 403 not_supported.
    slot_save_path: str | None = None
    # How tool calls are read from answers (vLLM's --tool-call-parser names); auto: from the
    # chat template (Mistral's [TOOL_CALLS], Llama 3's <|python_tag|>, else Hermes's <tool_call>).
    tool_call_parser: str = "auto"
    # auto: a <think> block (or the template's markers) at an answer's start is reasoning_content;
    # none: it stays in the content (llama.cpp's --reasoning-format).
    reasoning_format: str = "auto"

    def __post_init__(self) -> None:
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ConfigError(f"--tool-call-parser must be one of {', '.join(TOOL_CALL_PARSERS)}, "
                              f"got {self.tool_call_parser!r}")
        if self.reasoning_format not in REASONING_FORMATS:
            raise ConfigError(f"--reasoning-format must be one of {', '.join(REASONING_FORMATS)}, "
                              f"got {self.reasoning_format!r}")
        object.__setattr__(self, "slot_save_path", check_slot_save_path(self.slot_save_path))
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"--host must be a host name or address, got {self.host!r}")
        _int_in("--port", self.port, 0, 65535)
        if self.api_key is not None and (
            not isinstance(self.api_key, str) or not self.api_key.strip()
        ):
            raise ConfigError("--api-key must not be empty")
        if self.api_key is not None and not all(33 <= ord(c) < 127 for c in self.api_key):
            # It travels in an HTTP header: printable ASCII, no spaces.
            raise ConfigError("--api-key must be printable ASCII without spaces")
        _int_in("--max-connections", self.max_connections, 1, None)
        lists = (("--allow-origin", self.allow_origins), ("--allow-host", self.allow_hosts))
        for flag, values in lists:
            if not isinstance(values, (tuple, list)):
                raise ConfigError(f"{flag} values must be a list of strings, got {values!r}")
        origins = tuple(dict.fromkeys(normalise_allowed_origin(o) for o in self.allow_origins))
        object.__setattr__(self, "allow_origins", origins)
        hosts = tuple(dict.fromkeys(normalise_allowed_host(h) for h in self.allow_hosts))
        object.__setattr__(self, "allow_hosts", hosts)
        _int_in("--max-waiting", self.max_waiting, 0, None)
        _int_in("--max-body-bytes", self.max_body_bytes, 1024, None)
        if self.model_alias is not None and (
            not isinstance(self.model_alias, str) or not self.model_alias
        ):
            raise ConfigError("--model-alias must not be empty")
        keepalive = self.sse_keepalive_s
        if (
            isinstance(keepalive, bool)
            or not isinstance(keepalive, (int, float))
            or not math.isfinite(keepalive)
            or keepalive < 0
        ):
            raise ConfigError(
                f"--sse-keepalive must be a number of seconds >= 0, got {keepalive!r}"
            )


def _int_in(flag: str, value: object, low: int, high: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{flag} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        raise ConfigError(f"{flag} must be {bounds}, got {value}")


def resolve_api_key(flag: str | None, environ: Mapping[str, str]) -> str | None:
    """The API key: --api-key if given, else $STRATA_API_KEY (which keeps it out of `ps`)."""
    if flag is not None:
        return flag
    value = environ.get(API_KEY_ENV)
    if value is not None and not value.strip():
        # Set but empty is a mistake, not a wish to run without a key.
        raise ConfigError(f"{API_KEY_ENV} is set but empty; unset it to serve without a key")
    return value


def model_id(model: str | None, alias: str | None = None) -> str:
    """The id clients use for the model: the alias, else the file or directory name."""
    if alias:
        return alias
    path = model if model else DEFAULT_FILE
    name = os.path.basename(os.path.normpath(path))
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def check_slot_save_path(path: str | None) -> str | None:
    """--slot-save-path: an existing directory, held as its real path (None: slot files are off)."""
    if path is None:
        return None
    if not isinstance(path, str) or not path or not os.path.isdir(path):
        raise ConfigError(f"--slot-save-path must be an existing directory, got {path!r}")
    return os.path.realpath(path)
