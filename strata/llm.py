"""The offline Python API: `strata.LLM(...).generate(prompts, SamplingParams)`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from strata.config import EngineConfig
from strata.engine.interface import Collected, Engine, SessionRestored, SessionSaved, Timings, collect
from strata.sampling import SamplingParams

Prompt = str | Sequence[int]


@dataclass(frozen=True)
class Completion:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    truncated: bool
    num_cached_tokens: int
    timings: Timings | None


def _completion(request_id: str, prompt_ids: list[int], got: Collected) -> Completion:
    final = got.final
    return Completion(request_id, tuple(prompt_ids), tuple(got.token_ids), got.text, final.finish_reason,
                      final.truncated, final.num_cached_tokens, final.timings)


class LLM:
    """Loads a model once; `generate` runs many prompts at once over the engine's lanes.

    Keyword arguments are EngineConfig fields (`batch=7` gives 8 lanes, `kv_pool_tokens`,
    `kv_chunk`, `dtype`, ...); `model=None` is the embedded default model. `progress`: a
    loading bar on stderr, shown only when stderr is a terminal.
    """

    def __init__(self, model: str | None = None, progress: bool = True, **engine_options):
        engine_options.setdefault("batch", 7)
        self.engine = Engine(EngineConfig(model=model, **engine_options), progress=progress)
        self.tokenizer = self.engine.tokenizer

    def generate(
        self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> list[Completion]:
        """Generates for every prompt (a string, or token ids); results in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = SamplingParams() if params is None else params
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts need as many SamplingParams, got {len(params)}")
        prompt_ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        ids: list[str] = []
        try:  # a bad prompt or a refusal ends the call and leaves nothing queued behind it
            for p, sp in zip(prompt_ids, params):
                ids.append(self.engine.submit(p, sp))
            done = {i: collect(self.engine.stream(i)) for i in ids}  # all run together: each stream steps them all
        except BaseException:
            for i in ids:
                self.engine.cancel(i)
            raise
        return [_completion(i, p, done[i]) for i, p in zip(ids, prompt_ids)]

    def chat(
        self, conversations: Sequence[dict] | Sequence[Sequence[dict]], params: SamplingParams | None = None
    ) -> list[Completion]:
        """Like `generate`, for chat messages rendered with the model's chat template."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        prompts = [self.tokenizer.encode_chat(list(c)) for c in conversations]
        return self.generate(prompts, params)

    def save_session(self, path: str, token_ids: Sequence[int] | None = None, lane: int | None = None) -> SessionSaved:
        """Writes a held conversation to the session file `path`: the one holding the longest
        prefix of `token_ids` (e.g. a Completion's prompt_token_ids + token_ids: every token
        but the last sampled one has K/V), or lane `lane`'s. docs/sessions.md."""
        if (token_ids is None) == (lane is None):
            raise ValueError("save_session needs token_ids or lane (one of them)")
        return self.engine.save_session(path, lane=lane, token_ids=token_ids)

    def restore_session(self, path: str, lane: int | None = None) -> SessionRestored:
        """Holds the conversation of the session file `path` again; the next prompt that
        extends it prefills only its new tokens. A bad file changes nothing (SessionFileError)."""
        return self.engine.restore_session(path, lane=lane)
