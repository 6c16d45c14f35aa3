"""A request's life in the engine: sampling state, streamed text, stop checks, timings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from strata.detok import IncrementalDetokenizer
from strata.errors import StrataError
from strata.logit_controls import LogitControls
from strata.sampler import TokenLogprobs
from strata.sampling import SamplingParams


@dataclass(frozen=True)
class Timings:
    """llama.cpp's names: cached, prompt (computed) and predicted tokens, in ms and tok/s."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    draft_n: int | None = None  # with --spec: drafts proposed for the request
    draft_n_accepted: int | None = None  # ... and kept

    @property
    def prompt_per_second(self) -> float:
        return self.prompt_n / (self.prompt_ms / 1e3) if self.prompt_ms > 0 else 0.0

    @property
    def predicted_per_second(self) -> float:
        return self.predicted_n / (self.predicted_ms / 1e3) if self.predicted_ms > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": round(self.prompt_ms, 3),
            "prompt_per_second": round(self.prompt_per_second, 3),
            "predicted_n": self.predicted_n,
            "predicted_ms": round(self.predicted_ms, 3),
            "predicted_per_second": round(self.predicted_per_second, 3),
        } | ({} if self.draft_n is None else {"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted})


@dataclass(frozen=True)
class RequestOutput:
    """What happened to one request in one step (a streaming delta; `finished` at the end)."""

    request_id: str
    new_token_ids: tuple[int, ...] = ()
    new_text: str = ""
    new_logprobs: tuple[TokenLogprobs, ...] = ()
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    truncated: bool = False  # ended because the KV pool could not grow it
    stop_string: str | None = None  # the stop string that ended it (on the final output)
    error: StrataError | None = None  # set when the request was refused
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    timings: Timings | None = None
    # With a new token: seconds since the request's previous token, or since its arrival for
    # its first (time to first token); None without one
    latency_s: float | None = None


@dataclass(eq=False)
class RequestState:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    detok: IncrementalDetokenizer
    stop_token_ids: frozenset[int]
    arrival: float = field(default_factory=time.perf_counter)
    admitted: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    num_cached: int = 0
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    drafting: bool = False  # --spec: the engine drafts (timings then count drafts)
    num_drafted: int = 0  # drafts proposed for the request
    num_accepted: int = 0
    controls: LogitControls | None = None  # penalties, logit_bias, min_tokens, a grammar

    def on_token(self, token_id: int, logprobs: TokenLogprobs | None, can_continue: bool) -> RequestOutput:
        """Adds a sampled token; decides whether the request is finished."""
        now = time.perf_counter()
        latency = now - (self.last_token if self.last_token is not None else self.arrival)
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        self.output_ids.append(token_id)
        if self.controls is not None:
            self.controls.accept(token_id)
        text = ""
        if token_id in self.stop_token_ids:
            self.finish_reason = "stop"
        else:
            delta = self.detok.add(token_id)
            text = delta.text
            if delta.is_stopped:
                self.finish_reason = "stop"
        if self.finish_reason is None:
            max_tokens = self.params.max_tokens
            if (max_tokens is not None and len(self.output_ids) >= max_tokens) or not can_continue:
                self.finish_reason = "length"
        if self.finish_reason is not None and not self.detok.is_stopped:
            text += self.detok.finish()
        return RequestOutput(
            self.request_id,
            (token_id,),
            text,
            (logprobs,) if logprobs is not None else (),
            finished=self.finish_reason is not None,
            finish_reason=self.finish_reason,
            stop_string=self.detok.stop_string,
            **self.counts(),
            timings=self.timings() if self.finish_reason is not None else None,
            latency_s=latency,
        )

    def end(self, reason: str, truncated: bool = False, error: StrataError | None = None) -> RequestOutput:
        """The request ends without a new token (truncated, aborted or refused)."""
        self.finish_reason = reason
        text = "" if self.detok.is_stopped else self.detok.finish()
        return RequestOutput(
            self.request_id,
            new_text=text,
            finished=True,
            finish_reason=reason,
            truncated=truncated,
            error=error,
            stop_string=self.detok.stop_string,
            **self.counts(),
            timings=self.timings(),
        )

    def counts(self) -> dict:
        return {
            "num_prompt_tokens": len(self.prompt_ids),
            "num_cached_tokens": self.num_cached,
            "num_output_tokens": len(self.output_ids),
        }

    def timings(self) -> Timings:
        now = time.perf_counter()
        admitted = self.admitted if self.admitted is not None else now
        first = self.first_token if self.first_token is not None else now
        return Timings(
            cache_n=self.num_cached,
            prompt_n=len(self.prompt_ids) - self.num_cached,
            prompt_ms=(first - admitted) * 1e3,
            predicted_n=len(self.output_ids),
            predicted_ms=(now - first) * 1e3,
            draft_n=self.num_drafted if self.drafting else None,
            draft_n_accepted=self.num_accepted if self.drafting else None,
        )
