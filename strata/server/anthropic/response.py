"""A Messages response as server/respond.py streams it (`ResponseFormat`): Anthropic's events
(`message_start` ... `message_stop`), `ping` while nothing happens, an `error` event after
the stream started, and the whole `message` body."""

from __future__ import annotations

from strata.engine.interface import Collected, RequestOutput
from strata.server.anthropic.errors import error_event_payload
from strata.server.anthropic.shapes import PING, MessageFormat, event
from strata.server.handle import Admitted, Event


class MessagesResponse:
    def __init__(self, fmt: MessageFormat, eager_text: bool = False):
        self._fmt = fmt
        self._eager_text = eager_text  # the text block starts with the stream (no tools, no thinking markers)

    def opening(self, first: Event | None) -> list[str]:
        # Not admitted yet: message_start says 0 cached; message_delta's usage says how many were reused.
        cached = first.num_cached_tokens if isinstance(first, (Admitted, RequestOutput)) else 0
        return self._fmt.opening(cached, self._eager_text)

    def delta(self, out: RequestOutput, index: int = 0) -> list[str]:
        return self._fmt.delta(out)

    def closing(self, final: RequestOutput, index: int = 0) -> list[str]:
        return self._fmt.closing(final)

    def done(self, finals) -> list[str]:
        return []

    def error(self, error: BaseException) -> list[str]:
        return [event("error", error_event_payload(error))]

    def keepalive(self, admitted: bool) -> str:
        return PING

    def whole(self, gots) -> dict:
        got: Collected = gots[0]
        return self._fmt.message(got.text, got.final).model_dump(mode="json")
