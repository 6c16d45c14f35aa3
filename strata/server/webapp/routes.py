"""The browser app's files: `/` (the page) and `/ui/<file>` (its scripts and styles).

Plain files shipped in the package (`static/`): no build step, nothing fetched at run
time. They are open routes (no API key: the page asks for the key and sends it with each
API call), but pass the Host and Origin checks. Every answer carries a Content-Security-
Policy that allows only this server's own scripts, styles and connections: no inline
script and no event-handler attribute ever runs, whatever ends up in the page.
"""

from __future__ import annotations

import re
from importlib.resources import files

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

UI_PREFIX = "/ui/"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*\.(js|css|svg)$")

router = APIRouter()


def _file(name: str) -> Response:
    resource = files("strata.server.webapp").joinpath("static", name)
    if not resource.is_file():
        raise HTTPException(404)
    media_type = MEDIA_TYPES[name[name.rindex(".") :]]
    headers = {
        "Content-Security-Policy": CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }
    return Response(resource.read_bytes(), media_type=media_type, headers=headers)


@router.get("/", include_in_schema=False)
async def index() -> Response:
    return _file("index.html")


@router.get(UI_PREFIX + "{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    if not NAME.match(name):
        raise HTTPException(404)
    return _file(name)
