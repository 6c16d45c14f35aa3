"""Stored responses: what `previous_response_id` continues. Each keeps its conversation (the
chat messages before it, its input, its answer), so the next turn renders the same prefix and
the engine's conversation cache serves it: only the new turn is prefilled."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from strata.errors import RequestError

MAX_STORED = 1024  # responses kept; the least recently used go first


class ResponseStore:
    def __init__(self, limit: int = MAX_STORED):
        self._limit = limit
        self._lock = threading.Lock()
        self._items: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

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
