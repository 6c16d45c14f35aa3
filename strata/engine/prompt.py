"""A prompt's token ids, checked once where they enter (the HTTP edge, or `Engine.submit`).

`check_prompt` is the one check: not empty, shorter than --max-context (room for one new
token), every id in the vocabulary; each failure a RequestError naming the caller's field.
A `Prompt` has passed it, so `Engine.submit` takes one as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from strata.errors import ContextLengthExceeded, RequestError


@dataclass(frozen=True)
class Prompt:
    token_ids: tuple[int, ...]


def check_prompt(token_ids: Sequence[int], max_context: int, vocab_size: int, param: str = "prompt") -> Prompt:
    if not token_ids:
        raise RequestError("the prompt is empty", param=param)
    if len(token_ids) >= max_context:
        raise ContextLengthExceeded(len(token_ids), max_context, param)
    if any(not (0 <= t < vocab_size) for t in token_ids):
        raise RequestError(f"prompt token ids must be in [0, {vocab_size})", param=param)
    return Prompt(tuple(token_ids))
