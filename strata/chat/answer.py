"""One answer streamed from the engine, stoppable between steps.

`should_stop` is polled between engine steps (never inside one), so a stop leaves the
engine consistent: the request is aborted, its chunks go back to the pool, and the cached
conversation it extended stays cached.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from strata.engine.engine import Engine
from strata.engine.request import Timings
from strata.sampling import SamplingParams


@dataclass(frozen=True)
class AnswerStats:
    text: str
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens reused from the conversation cache
    num_output_tokens: int
    finish_reason: str  # "stop" | "length" | "abort" (stopped by the user)
    truncated: bool
    timings: Timings | None

    @property
    def num_new_tokens(self) -> int:
        """Prompt tokens computed for this answer."""
        return self.num_prompt_tokens - self.num_cached_tokens


def stream_answer(
    engine: Engine,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    on_text: Callable[[str], None],
    should_stop: Callable[[], bool],
) -> AnswerStats:
    """Runs one request to its end (or until `should_stop()`), passing text as it comes."""
    request_id = engine.add_request(list(prompt_ids), params)
    text: list[str] = []
    num_cached = num_output = 0
    while True:
        if should_stop():
            engine.abort(request_id)
            return AnswerStats(
                "".join(text), len(prompt_ids), num_cached, num_output, "abort", False, None
            )
        for out in engine.step():
            if out.request_id != request_id:
                continue
            if out.error is not None:
                raise out.error
            num_cached, num_output = out.num_cached_tokens, out.num_output_tokens
            if out.new_text:
                text.append(out.new_text)
                on_text(out.new_text)
            if out.finished:
                return AnswerStats(
                    "".join(text), out.num_prompt_tokens, out.num_cached_tokens,
                    out.num_output_tokens, out.finish_reason or "stop", out.truncated, out.timings,
                )
