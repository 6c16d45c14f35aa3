"""`POST /slots/{id}?action=save|restore|erase`: session files over HTTP, in llama.cpp's shape.

The body names a file (`{"filename": "name.bin"}`) inside `--slot-save-path`, and nothing
else: a name with a path separator, a NUL, `..`, a leading dot (the save's temporary
files), an absolute path, more than NAME_MAX (255) bytes, or a symlink whose target
leaves the directory is a 400 `invalid_filename` before anything is read or written.
Without `--slot-save-path`, save and restore answer 403 `not_supported` (llama.cpp says
501; a 5xx would read as the server's fault). Save and restore stream on a worker thread
while the other lanes decode (engine/session.py); a lane serving a request, or held by
another session file in flight, is a 409 `slot_busy`; an erase wins over a restore in
flight into its slot (the restore answers 409 `restore_cancelled`). The storage's errors
are named: no space 507 `insufficient_storage`, no permission 403 `permission_denied`, a
read-only filesystem 409 `read_only_storage`, a vanished directory 409 `directory_missing`. Responses carry
llama.cpp's fields: `id_slot`, `filename`, `n_saved`/`n_written` or `n_restored`/`n_read`,
`timings` (`save_ms`/`restore_ms`); erase answers `id_slot` and `n_erased`.
"""

from __future__ import annotations

import os
from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from strata.errors import RequestError, SlotFilesOff
from strata.server.responses import ErrorResponse
from strata.server.routes import ERRORS

NAME_MAX = 255


class SlotFileRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    filename: str | None = None


def confined_path(directory: str, filename: str | None) -> str:
    """The path of `filename` inside `directory` (a real path); RequestError unless it stays there."""
    def bad(why: str) -> RequestError:
        return RequestError(f"filename {filename!r:.80}: {why}", code="invalid_filename", param="filename")

    if not filename:
        raise bad("a file name is required")
    if "/" in filename or "\\" in filename or "\0" in filename or os.path.isabs(filename):
        raise bad("a bare file name is required (no path separators, no absolute path)")
    if ".." in filename or filename.startswith("."):
        raise bad("'..' and leading dots are not allowed")
    if len(filename.encode("utf-8", "surrogatepass")) > NAME_MAX:
        raise bad(f"longer than {NAME_MAX} bytes")
    path = os.path.join(directory, filename)
    if os.path.islink(path) and os.path.dirname(os.path.realpath(path)) != directory:
        raise bad("a symlink that leads out of --slot-save-path")
    return path


slots_router = APIRouter()


SLOT_ERRORS = {
    **ERRORS,
    403: {"model": ErrorResponse, "description": "--slot-save-path is not set, a web origin not allowed, or the "
                                                "directory not writable (permission_denied)"},
    409: {"model": ErrorResponse, "description": "the slot is serving a request or held by a session file "
                                                "(slot_busy), or the directory is read-only or gone"},
    507: {"model": ErrorResponse, "description": "no space left for the file (insufficient_storage)"},
}


@slots_router.post("/slots/{id_slot}", responses=SLOT_ERRORS)
async def slot_action(
    id_slot: int, action: Literal["save", "restore", "erase"], request: Request, body: SlotFileRequest | None = None
) -> dict:
    state = request.app.state.strata
    loop = state.loop
    loop.check_ready()
    if action == "erase":
        n = await loop.call(lambda engine: engine.erase_lane(id_slot))
        return {"id_slot": id_slot, "n_erased": n}
    directory = state.settings.slot_save_path
    if directory is None:
        raise SlotFilesOff()
    filename = body.filename if body is not None else None
    path = confined_path(directory, filename)
    if action == "save":
        saved = await loop.session(lambda engine: engine.begin_save_session(path, lane=id_slot))
        return {"id_slot": id_slot, "filename": filename, "n_saved": saved.num_cells,
                "n_written": saved.num_bytes, "timings": {"save_ms": saved.seconds * 1e3}}
    restored = await loop.session(lambda engine: engine.begin_restore_session(path, lane=id_slot))
    return {"id_slot": id_slot, "filename": filename, "n_restored": restored.num_cells,
            "n_read": restored.num_bytes, "timings": {"restore_ms": restored.seconds * 1e3}}
