"""Errors raised at strata's edges. Each carries what a user needs to act on it."""

from __future__ import annotations

import secrets


def new_error_id() -> str:
    """An id for one failure (`err-` + 12 hex digits): the client gets it, the log repeats it."""
    return f"err-{secrets.token_hex(6)}"


class StrataError(Exception):
    """Base of every error strata raises on purpose."""


class ConfigError(StrataError, ValueError):
    """A flag or environment variable has a bad value; the message names it."""


class LoaderError(StrataError):
    """A model file or directory cannot be loaded; the message names the file or field."""


class RequestError(StrataError, ValueError):
    """A request is malformed or cannot be served as asked (HTTP 400)."""

    def __init__(self, message: str, code: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


class ContextLengthExceeded(RequestError):
    """The prompt is longer than `--max-context` allows (HTTP 400)."""

    def __init__(self, num_prompt_tokens: int, max_context: int, param: str = "messages"):
        super().__init__(
            f"the prompt has {num_prompt_tokens} tokens, more than --max-context "
            f"{max_context} allows (it must leave room for at least one new token)",
            code="context_length_exceeded",
            param=param,
        )
        self.num_prompt_tokens = num_prompt_tokens
        self.max_context = max_context


class PoolFullError(StrataError):
    """The KV pool cannot hold a new request even after parked conversations gave way.

    Retryable: `retry_after` is a hint in whole seconds (HTTP 503 + Retry-After).
    """

    code = "kv_pool_full"

    def __init__(self, num_chunks_needed: int, num_chunks_free: int, retry_after: int):
        super().__init__(
            f"the KV pool is full: the request needs {num_chunks_needed} more chunks, "
            f"{num_chunks_free} are free after parked conversations gave way; "
            f"retry in {retry_after} s"
        )
        self.num_chunks_needed = num_chunks_needed
        self.num_chunks_free = num_chunks_free
        self.retry_after = retry_after


class QueueFullError(StrataError):
    """Too many requests are already waiting for a lane (HTTP 503 + Retry-After)."""

    code = "queue_full"

    def __init__(self, num_waiting: int, retry_after: int = 1):
        super().__init__(f"{num_waiting} requests are already waiting for a lane; retry later")
        self.retry_after = retry_after


class StepFailed(StrataError):
    """The engine failed while computing a step that carried this request (HTTP 500).

    Only that step's requests end; their K/V goes back to the pool and every other
    conversation carries on. The message is short and names `error_id`; the details
    are in the server's log under the same id.
    """

    code = "server_error"

    def __init__(self, error_id: str):
        super().__init__(
            f"the engine failed while computing this request (error id {error_id}); "
            "the request was ended and its K/V freed, other requests are unaffected: retry it"
        )
        self.error_id = error_id


class PoolError(StrataError):
    """A pool contract was broken by its caller (a bug); raised before any state changes."""


class PoolExhausted(PoolError):
    def __init__(self, num_wanted: int, num_free: int):
        super().__init__(f"the pool was asked for {num_wanted} chunks with {num_free} free")
        self.num_wanted = num_wanted
        self.num_free = num_free


class ChunkNotHeld(PoolError):
    def __init__(self, operation: str, chunk_id: int, refcount: int, times: int = 1):
        super().__init__(
            f"{operation} of chunk {chunk_id} {times} time(s), but it has {refcount} holder(s)"
        )
        self.chunk_id = chunk_id


class SessionFileError(RequestError):
    """A session file cannot be restored: unreadable, truncated, corrupt, another version,
    or made by another model or K/V geometry; the message says which (HTTP 400)."""

    def __init__(self, path: str, why: str, code: str = "invalid_session_file"):
        super().__init__(f"session file {path}: {why}", code=code)
        self.why = why


class LaneBusy(RequestError):
    """A lane's conversation is being extended by a request (or a session file in flight holds
    the lane): it cannot be saved, replaced or erased until that ends (HTTP 409)."""

    def __init__(self, lane: int, what: str, holder: str = "serving a request", until: str = "the request ends"):
        super().__init__(f"slot {lane} is {holder}: {what} it when {until}", code="slot_busy")


class SlotFilesOff(StrataError):
    """POST /slots/{id}?action=save|restore on a server without --slot-save-path (403: it is
    refused by configuration, and a 5xx would read as the server's fault)."""

    code = "not_supported"

    def __init__(self) -> None:
        super().__init__("slot save and restore are off on this server: start it with --slot-save-path DIR")


class StorageError(StrataError):
    """A session file's storage refused an operation (not its content, not a bug): the message
    names the path, what was being done, the bytes it needed and what the filesystem said.
    Subclasses name the cause; their HTTP statuses are in server/errors.py's HTTP_STATUS."""

    code = "storage_error"
    error_type = "storage_error"

    def __init__(self, path: str, message: str, num_bytes: int | None = None):
        super().__init__(message)
        self.path = path
        self.num_bytes = num_bytes


class StorageFull(StorageError):
    """No space (ENOSPC) or quota (EDQUOT) left where a session file is written (HTTP 507)."""

    code = "insufficient_storage"


class StoragePermission(StorageError):
    """The process may not write (or read) there: EACCES, EPERM (HTTP 403)."""

    code = "permission_denied"


class StorageReadOnly(StorageError):
    """The directory is on a read-only filesystem: EROFS (HTTP 409)."""

    code = "read_only_storage"


class StorageMissing(StorageError):
    """The directory a session file goes in (or came from) no longer exists (HTTP 409)."""

    code = "directory_missing"


class RestoreCancelled(RequestError):
    """A restore in flight was dropped because its slot was erased meanwhile (HTTP 409)."""

    def __init__(self, path: str, lane: int):
        super().__init__(f"the restore of {path} into slot {lane} was dropped: the slot was erased meanwhile",
                         code="restore_cancelled")
