"""`strata serve`: the OpenAI-compatible server on uvicorn.

The port opens at once and the model loads on the engine thread, so /health answers 503
while loading; if loading fails the server stops and the command exits with status 1.
With `--fd N` it serves on a socket its parent already bound (a supervisor, a test): no
port is ever free between the parent choosing it and the server listening.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping

from strata.engine_args import add_engine_args, engine_config
from strata.errors import ConfigError
from strata.server.settings import (
    API_KEY_ENV,
    DEFAULT_HOST,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_WAITING,
    DEFAULT_PORT,
    DEFAULT_SSE_KEEPALIVE_S,
    REASONING_FORMATS,
    TOOL_CALL_PARSERS,
    ServerSettings,
    model_id,
    resolve_api_key,
)

log = logging.getLogger("strata.server")
SERVE_DEFAULT_BATCH = 3
# Prompt tokens per step while serving: a step that also reads a prompt piece stays under
# 100 ms with 7 lanes decoding on 2 cores (benchmarks/serve.py), so no stream stalls long;
# 64 and 96 gave longer worst gaps and no more output at 8 clients (docs/benchmarks.md).
SERVE_DEFAULT_PREFILL_CHUNK = 48
# Where AMX runs the prompt rows' dense GEMMs and SDPA, flat in rows, so a piece's cost is
# mostly its weights streamed from memory: twice the piece for the same bytes; at 8 clients
# 182 -> 200 output tok/s with each stream's worst gap 105 ms at p99 (Sapphire Rapids-class guest).
SERVE_DEFAULT_PREFILL_CHUNK_AMX = 96
# A lone prompt (no lane decoding, so no decode gap to protect) is read in pieces this big:
# one step for most prompts, as a single-request server would.
SERVE_DEFAULT_PREFILL_ALONE = 2048


def serve_default_prefill_chunk() -> int:
    """`strata serve`'s and `strata cluster`'s --prefill-chunk default on this CPU."""
    from strata.models.packed import cpu_amx

    return SERVE_DEFAULT_PREFILL_CHUNK_AMX if cpu_amx() else SERVE_DEFAULT_PREFILL_CHUNK


def add_serve_parser(subparsers: argparse._SubParsersAction) -> None:
    s = subparsers.add_parser("serve", help="serve an OpenAI-compatible HTTP API")
    add_server_args(s)
    s.add_argument_group("server").add_argument(
        "--fd",
        type=int,
        default=None,
        metavar="N",
        help="serve on the TCP socket N, already bound and inherited from the parent process "
        "(--host and --port are then the socket's own)",
    )
    add_engine_args(s, default_batch=SERVE_DEFAULT_BATCH, default_prefill_chunk=serve_default_prefill_chunk(),
                    default_prefill_alone=SERVE_DEFAULT_PREFILL_ALONE)
    s.set_defaults(func=cmd_serve)


def add_server_args(s: argparse.ArgumentParser) -> None:
    """The HTTP server's flags (`strata serve`, and `strata cluster`'s front door)."""
    g = s.add_argument_group("server")
    g.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to bind (default {DEFAULT_HOST}: this machine only)",
    )
    g.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port to bind (default {DEFAULT_PORT})"
    )
    g.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health "
        f"(default: ${API_KEY_ENV}, which keeps the key out of `ps`; this flag wins over it)",
    )
    g.add_argument(
        "--max-waiting",
        type=int,
        default=DEFAULT_MAX_WAITING,
        help="requests that may wait for a lane; more is a 503 with Retry-After",
    )
    g.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body (413 beyond)",
    )
    g.add_argument(
        "--model-alias",
        default=None,
        help="the model id clients send (default: the model file's name)",
    )
    g.add_argument(
        "--sse-keepalive",
        type=float,
        default=DEFAULT_SSE_KEEPALIVE_S,
        help="seconds between SSE keep-alive comments; a stream waiting this long for a lane starts",
    )
    g.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="requests in flight at once, streams included (/health and /metrics aside); "
        f"more is a 503 too_many_connections (default {DEFAULT_MAX_CONNECTIONS})",
    )
    g.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web origin (https://app.example:8443, or *) whose pages may call the API "
        "(CORS); repeatable or comma-separated. Other sites' browser requests are a 403",
    )
    g.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host header name to accept besides the addresses bound (*.domain for "
        "subdomains, * for any, e.g. behind a proxy); repeatable or comma-separated",
    )
    g.add_argument(
        "--slot-save-path",
        default=None,
        metavar="DIR",
        help="the directory POST /slots/{id}?action=save|restore keeps session files in "
        "(file names only, confined to DIR); absent, those actions answer 403",
    )
    g.add_argument(
        "--tool-call-parser",
        default="auto",
        choices=TOOL_CALL_PARSERS,
        help="how tool calls are read from answers: hermes (<tool_call> JSON), llama3_json, "
        "mistral ([TOOL_CALLS]); auto (default) chooses from the chat template",
    )
    g.add_argument(
        "--reasoning-format",
        default="auto",
        choices=REASONING_FORMATS,
        help="auto (default): a <think> block at an answer's start is sent as reasoning_content "
        "(Anthropic: thinking blocks); none: it stays in the content",
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listed(values: list[str]) -> tuple[str, ...]:
    """Repeated flags, each possibly a comma-separated list."""
    return tuple(item.strip() for value in values for item in value.split(",") if item.strip())


def server_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> ServerSettings:
    """The server's settings from the command line (and $STRATA_API_KEY); validated."""
    return ServerSettings(
        host=args.host,
        port=args.port,
        api_key=resolve_api_key(args.api_key, environ),
        max_waiting=args.max_waiting,
        max_body_bytes=args.max_body_bytes,
        model_alias=args.model_alias,
        sse_keepalive_s=args.sse_keepalive,
        max_connections=args.max_connections,
        allow_origins=_listed(args.allow_origin),
        allow_hosts=_listed(args.allow_host),
        slot_save_path=args.slot_save_path,
        tool_call_parser=args.tool_call_parser,
        reasoning_format=args.reasoning_format,
    )


def inherited_socket(fd: int) -> socket.socket:
    """`--fd N`: the bound TCP socket N (uvicorn listens on it)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ConfigError(f"--fd {fd} is not an open socket ({exc.strerror})") from exc
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
        sock.detach()
        raise ConfigError(f"--fd {fd} must be a TCP socket")
    if sock.getsockname()[1] == 0:
        sock.detach()
        raise ConfigError(f"--fd {fd} must be bound to an address (it has no port)")
    return sock


def cmd_serve(args: argparse.Namespace) -> int:
    # Imported here, not at the top: `strata generate` needs none of them (torch, uvicorn).
    import uvicorn

    from strata.engine.interface import Engine
    from strata.server.app import create_app
    from strata.server.listener import raise_fd_limit, uvicorn_config

    config = engine_config(args)  # a bad engine flag fails here, before the port opens
    sock = inherited_socket(args.fd) if args.fd is not None else None
    if sock is not None:  # the Host check and the printed address follow the socket
        args.host, args.port = sock.getsockname()[:2]
    settings = server_settings(args, os.environ)
    if not _is_loopback(settings.host) and settings.api_key is None:
        log.warning(
            "serving on %s without --api-key: anyone who can reach it can use it", settings.host
        )
    name = model_id(config.model, settings.model_alias)
    failures: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_load_error(exc: BaseException) -> None:
        failures.append(exc)
        if server is not None:
            server.should_exit = True

    app = create_app(
        settings, lambda: Engine(config, progress=sys.stderr.isatty()), name, on_load_error
    )
    fd_limit = raise_fd_limit()
    server = uvicorn.Server(
        uvicorn_config(app, settings, log_level="info" if args.verbose else "warning", fd_limit=fd_limit)
    )
    app.state.strata_stopping = lambda: server.should_exit  # open monitor feeds end at once
    print(
        f"strata: serving {name} at http://{settings.host}:{settings.port}/v1 (loading the model)",
        file=sys.stderr,
    )
    # uvicorn stops gracefully on SIGTERM, then raises it again against the handler it found:
    # this one, so a supervisor's stop ends with the summary below and status 0.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run(sockets=[sock] if sock is not None else None)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if failures:
        print(f"strata: error: the model failed to load: {failures[0]}", file=sys.stderr)
        return 1
    snap = app.state.strata.loop.snapshot  # the engine's last: after it ended every open request
    if snap is not None:
        print(f"strata: stopped: {snap.num_running} request(s) running, {snap.num_chunks_active} of "
              f"{snap.pool.num_chunks_total} K/V chunks held by requests", file=sys.stderr)
    return 0
