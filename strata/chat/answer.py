"""One answer streamed from the engine, stoppable between steps.

`should_stop` is polled between engine steps (never inside one), so a stop leaves the
engine consistent: the request is aborted, its chunks go back to the pool, and the cached
conversation it extended stays cached.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from strata.engine.interface import Engine, Timings, collect
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
    request_id = engine.submit(list(prompt_ids), params)
    got = collect(engine.stream(request_id, stop=should_stop), on_text)
    final = got.final
    if final.finish_reason == "abort":  # stopped by the user: timings of an unfinished answer say little
        return AnswerStats(got.text, len(prompt_ids), final.num_cached_tokens, final.num_output_tokens, "abort",
                           False, None)
    return AnswerStats(got.text, final.num_prompt_tokens, final.num_cached_tokens, final.num_output_tokens,
                       final.finish_reason or "stop", final.truncated, final.timings)
