"""The requests the engine thread owes a final event, and how they all end when the loop cannot go on.

Engine thread only. A request is owed from the moment the engine accepts it (`submit`) until
its finished output is posted (`discard`) or its handle is closed (`cancel`). A request the
engine refuses is never owed: its refusal is its final event. The
engine's own open requests and this set together are every request the loop took and has not
ended (`accepted`): a step that failed outside execute may have lost some from the engine.
Each ending here turns them into `Failed` events, so no handler waits forever.
"""

from __future__ import annotations

import logging

from strata.engine.interface import Engine
from strata.errors import StrataError
from strata.server.engine_commands import Add
from strata.server.errors import ServerError
from strata.server.handle import Event, Failed
from strata.server.metrics import ServerMetrics

log = logging.getLogger("strata.server")


class OwedFinals:
    def __init__(self, metrics: ServerMetrics):
        self._metrics = metrics
        self._ids: set[str] = set()  # added here, final event not yet posted

    def submit(self, engine: Engine, command: Add) -> list[tuple[str, Event]]:
        """Hands `command`'s request (or n choices of its prompt) to the engine; returns the
        final events of a refusal (a StrataError as it is; anything else as a ServerError with
        an incident id, its cause in the log), else nothing: the requests are owed."""
        ids = command.request_ids
        try:
            if len(ids) == 1:
                engine.submit(command.prompt, command.params[0], ids[0], arrival=command.arrival)
            else:
                engine.submit_choices(command.prompt, command.params, ids, arrival=command.arrival)
        except StrataError as exc:
            return [(request_id, Failed(exc)) for request_id in ids]
        except Exception as exc:  # the client gets an incident id; the log gets the cause under it
            log.exception("submit failed")
            error = ServerError("the engine could not take the request")
            error.__cause__ = exc
            return [(request_id, Failed(error)) for request_id in ids]
        self._ids.update(ids)
        return []

    def cancel(self, engine: Engine, request_id: str) -> None:
        """The request's handle was closed before its final event: the engine aborts it."""
        self._ids.discard(request_id)
        if engine.cancel(request_id) is not None:
            self._metrics.finished.labels("abort").inc()

    def discard(self, request_id: str) -> None:
        """The request's final event is posted."""
        self._ids.discard(request_id)

    def accepted(self, engine: Engine) -> list[str]:
        """Every request this loop took and has not ended (in the engine, or lost in a failed step)."""
        return list(dict.fromkeys([*engine.open_requests(), *self._ids]))

    def fail_all(self, engine: Engine, error: Exception) -> list[tuple[str, Event]]:
        """A step failed outside execute (the scheduler's state is unknown): every accepted
        request is cancelled where it can be and ends with `error`, counted as an error."""
        batch: list[tuple[str, Event]] = []
        for request_id in self.accepted(engine):
            try:
                engine.cancel(request_id)
            except Exception:
                log.exception("cancel after a failed step")
            batch.append((request_id, Failed(error)))
            self._metrics.finished.labels("error").inc()
        self._ids.clear()
        return batch

    def end_all(self, engine: Engine, error: Exception) -> list[tuple[str, Event]]:
        """Shutdown: every accepted request is cancelled and ends with `error`."""
        batch: list[tuple[str, Event]] = []
        for request_id in self.accepted(engine):
            engine.cancel(request_id)
            batch.append((request_id, Failed(error)))
        return batch

    def abandon(self, engine: Engine, error: Exception) -> list[tuple[str, Event]]:
        """The engine loop itself stopped on a bug: every accepted request ends with `error`,
        without touching the engine further."""
        return [(request_id, Failed(error)) for request_id in self.accepted(engine)]
