"""Stored responses: what `previous_response_id` continues. Each keeps its conversation (the
chat messages before it, its input, its answer), so the next turn renders the same prefix and
the engine's conversation cache serves it: only the new turn is prefilled.

A store may have an `owner` (a cluster replica's id): its response ids then name it
(`resp_<owner>_<request id>`; request ids hold no `_`), so the cluster's front door sends a
follow-up to the one replica that holds its conversation (`owner_of`)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from strata.errors import RequestError

MAX_STORED = 1024  # responses kept; the least recently used go first
PREFIX = "resp_"


def owner_of(response_id: str) -> str | None:
    """The owner a response id names, or None (a single server's id, or not one of ours)."""
    if not response_id.startswith(PREFIX):
        return None
    owner, sep, _ = response_id[len(PREFIX):].rpartition("_")
    return owner if sep and owner else None


class ResponseStore:
    def __init__(self, limit: int = MAX_STORED, owner: str | None = None):
        self._limit = limit
        self.owner = owner
        self._lock = threading.Lock()
        self._items: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def response_id(self, request_id: str) -> str:
        """The id of the response that request `request_id` answers."""
        assert "_" not in request_id, request_id
        return f"{PREFIX}{self.owner}_{request_id}" if self.owner else f"{PREFIX}{request_id}"

    def put(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        with self._lock:
            self._items[response_id] = messages
            self._items.move_to_end(response_id)
            while len(self._items) > self._limit:
                self._items.popitem(last=False)

    def conversation(self, response_id: str) -> list[dict[str, Any]]:
        """The messages of a stored response's conversation, answer included."""
        with self._lock:
            found = self._items.get(response_id)
            if found is not None:
                self._items.move_to_end(response_id)
        if found is None:
            raise RequestError(f"previous_response_id: no stored response {response_id!r} "
                               "(responses are kept in memory while the server runs, and only with store)",
                               param="previous_response_id", code="previous_response_not_found")
        return list(found)
