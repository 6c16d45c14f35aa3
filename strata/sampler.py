"""Turn one step's logits for several sequences into next tokens, in one call.

Per row, in this order (vLLM's order):
1. greedy rows (`SamplingParams.is_greedy`): `argmax`, ties broken by the lowest id;
   they never touch their generator;
2. sampled rows: logits / temperature, then top-k, then top-p (nucleus, on the
   distribution left by top-k), then min-p (relative to the most likely token), then
   one draw by inverse CDF from a single uniform taken from the row's own generator.

Every filter is "keep the tokens whose scaled logit is >= a per-row threshold", so the
three combine into one threshold (their maximum) and one masking pass. The most likely
token always survives (each threshold is <= the row's max). Tokens tied with the
boundary value are all kept: top-k may keep more than k tokens and top-p slightly more
than the smallest set when values tie exactly at the cut.

Batch independence: a seeded row gives the same tokens whatever else is in the batch.
The draw only uses ops whose result for a row does not depend on the other rows
(elementwise ops, amax, topk, cumsum along the row; never a `sum` over the vocab, whose
reduction order on CPU changes with the batch's shape).

Cost (16 rows x 49k vocab, 2 CPU cores): greedy < 1 ms, sampled ~3-10 ms. Top-p sorts
only the most likely 256 tokens per row (a topk); a row whose nucleus is wider makes
the batch look at 4096, then the whole vocab (~30 ms), so flat distributions cost more.

Logprobs follow OpenAI and vLLM's default: `log_softmax` of the raw logits (temperature
1, before top-k/top-p/min-p), in float32, for the chosen token and the top-N
alternatives, whatever filters chose the token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from strata.sampling import SamplingParams

# Top-p first looks for the nucleus among this many most likely tokens (a partial
# sort, far cheaper than sorting the vocab); it looks at 16x more while a row's
# nucleus is wider.
DEFAULT_TOP_P_CANDIDATES = 256
# Tokens less likely than e^MIN_LOG_RATIO (~1.8e-35) times the row's most likely token
# are never drawn: a float32 cdf cannot tell their share apart from zero anyway.
MIN_LOG_RATIO = -80.0


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: float  # raw log_softmax of the chosen token
    # The `params.logprobs` most likely tokens as (token id, logprob), most likely first.
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class SampleOutput:
    token_ids: list[int]  # one per row
    logprobs: list[TokenLogprobs | None]  # one per row; None where params.logprobs is None


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[rows, vocab] float -> [rows] long: each row's first maximum, a NaN counting as the
    maximum (as `torch.argmax`). On the CPU through numpy's argmax on float32 values (exact for
    bfloat16 and float16 too), an order of magnitude faster than torch's for a few rows of a
    vocabulary; elsewhere torch's."""
    if logits.device.type != "cpu":
        return logits.argmax(dim=-1)
    values = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    return torch.from_numpy(values.contiguous().numpy().argmax(axis=-1))


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator | None:
    """A generator on `device` seeded with `seed` (mod 2**64), or None when unseeded."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed % 2**64)
    return generator


def draw(weights: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of `weights` [n, vocab] (unnormalised, some > 0) by inverse CDF, from
    one uniform of the row's generator; returns [n] token ids."""
    cdf = weights.cumsum(dim=-1)  # [n, vocab], non-decreasing
    total = cdf[:, -1:]  # [n, 1], > 0
    uniforms = [torch.rand(1, generator=g, device=weights.device) for g in generators]
    uniform = torch.cat(uniforms)[:, None]  # [n, 1] in [0, 1)
    # Strictly below total, so the first cdf entry above it exists and has weight > 0.
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)[:, 0]  # [n]


class Sampler:
    def __init__(self, top_p_candidates: int = DEFAULT_TOP_P_CANDIDATES):
        if top_p_candidates < 1:
            raise ValueError(f"top_p_candidates must be >= 1, got {top_p_candidates}")
        self.top_p_candidates = top_p_candidates

    def sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        raw: torch.Tensor | None = None,
    ) -> SampleOutput:
        """`logits`: [rows, vocab], any float dtype; `params`, `generators`: one per row;
        `raw`: the logits before a request's logit controls, for logprobs (default `logits`).

        A row's generator (None: torch's default generator for the device) must live on
        `logits.device`; a seeded row consumes one uniform per sampled step.
        """
        if logits.dim() != 2 or not logits.is_floating_point():
            raise ValueError(
                f"logits must be a 2-D float tensor, got {tuple(logits.shape)} {logits.dtype}"
            )
        rows = logits.shape[0]
        if len(params) != rows or len(generators) != rows:
            raise ValueError(
                f"{rows} logit rows need as many params and generators, "
                f"got {len(params)} and {len(generators)}"
            )
        device = logits.device
        logits = logits.float()  # [rows, vocab]
        greedy = [i for i, p in enumerate(params) if p.is_greedy]
        sampled = [i for i, p in enumerate(params) if not p.is_greedy]

        if not sampled:
            token_ids = row_argmax(logits)  # [rows]
        else:
            token_ids = torch.empty(rows, dtype=torch.long, device=device)  # [rows]
            if greedy:
                index = torch.tensor(greedy, device=device)
                token_ids[index] = row_argmax(logits[index]).to(device)
            index = torch.tensor(sampled, device=device)
            rows_logits = logits[index] if greedy else logits  # [n, vocab]
            token_ids[index] = self._draw(
                rows_logits, [params[i] for i in sampled], [generators[i] for i in sampled]
            )
        token_list: list[int] = token_ids.tolist()
        raw = logits if raw is None else raw.float()
        return SampleOutput(token_list, self.logprobs_of(raw, params, token_ids, token_list))

    def _draw(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> torch.Tensor:
        """`logits`: [n, vocab] float32 of sampled rows; returns [n] token ids."""
        return draw(self.filtered_weights(logits, params), generators)

    def filtered_weights(self, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """[n, vocab] float32: each row's unnormalised probabilities after temperature, top-k,
        top-p and min-p (1 at the row's most likely token, 0 where filtered)."""
        device = logits.device
        temperatures = torch.tensor([p.temperature for p in params], device=device)  # [n]
        scaled = logits / temperatures[:, None]  # [n, vocab]
        row_max = scaled.amax(dim=-1, keepdim=True)  # [n, 1]

        # Unnormalised probabilities, 1 at the row's max. The clamp keeps exp out of
        # float32's (slow) denormal range; the floor threshold below zeroes what it lifted.
        weights = (scaled - row_max).clamp_(min=MIN_LOG_RATIO).exp_()  # [n, vocab]

        # Each filter keeps the tokens whose scaled logit is >= its threshold ([n, 1]);
        # the floor drops tokens below e^MIN_LOG_RATIO times the most likely one.
        log_ratio = [
            max(math.log(p.min_p), MIN_LOG_RATIO) if p.min_p > 0 else MIN_LOG_RATIO for p in params
        ]
        # min-p: p_i >= min_p * p_max  <=>  s_i >= s_max + log(min_p).
        threshold = row_max + torch.tensor(log_ratio, device=device)[:, None]  # [n, 1]
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            top = self._top_k_top_p_threshold(scaled, row_max, weights, params)
            threshold = torch.maximum(threshold, top)
        return weights.masked_fill_(scaled < threshold, 0.0)  # 0 where filtered

    def _top_k_top_p_threshold(
        self,
        scaled: torch.Tensor,
        row_max: torch.Tensor,
        weights: torch.Tensor,
        params: list[SamplingParams],
    ) -> torch.Tensor:
        """Per-row logit threshold of top-k then top-p; [n, 1], -inf where both are off.

        `scaled`: [n, vocab] temperature-scaled logits; `row_max`: [n, 1] their maxima;
        `weights`: [n, vocab] exp(scaled - row_max), read only.
        Sorts only the C most likely tokens (C grows x16 while a nucleus is wider).
        """
        n, vocab = scaled.shape
        device = scaled.device
        ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]  # 0: off
        top_ps = [p.top_p for p in params]
        needs_p = any(p < 1.0 for p in top_ps)
        num_candidates = min(vocab, max(self.top_p_candidates if needs_p else 1, *ks))
        candidates = scaled.topk(num_candidates, dim=-1).values  # [n, C], descending
        neg_inf = torch.full((n, 1), -math.inf, device=device)

        has_k = torch.tensor([k > 0 for k in ks], device=device)[:, None]  # [n, 1]
        k_index = torch.tensor([max(k, 1) - 1 for k in ks], device=device)[:, None]  # [n, 1]
        k_threshold = torch.where(has_k, candidates.gather(1, k_index), neg_inf)  # [n, 1]
        if not needs_p:
            return k_threshold

        # Mass (unnormalised, relative to the max) that top-k left, over the whole row.
        kept = weights.masked_fill(scaled < k_threshold, 0.0)  # [n, vocab]
        total = kept.cumsum(dim=-1)[:, -1:]  # [n, 1]; cumsum: batch-independent
        top_p = torch.tensor(top_ps, device=device)[:, None]  # [n, 1]
        has_p = top_p < 1.0
        goal = top_p * total  # [n, 1]
        while True:
            # candidates stay a superset of the top-k survivors: C >= every k.
            mass = (candidates - row_max).clamp_(min=MIN_LOG_RATIO).exp_()  # [n, C]
            inclusive = mass.masked_fill_(candidates < k_threshold, 0.0).cumsum(dim=-1)
            unresolved = has_p & (inclusive[:, -1:] < goal)  # the nucleus is wider than C
            if num_candidates == vocab or not bool(unresolved.any()):
                break
            num_candidates = min(vocab, num_candidates * 16)
            candidates = scaled.topk(num_candidates, dim=-1).values
        exclusive = torch.cat([torch.zeros_like(total), inclusive[:, :-1]], dim=-1)  # [n, C]
        # Keep candidate j while the mass before it is short of the goal; j = 0 always.
        num_keep = (exclusive < goal).sum(dim=-1, keepdim=True)  # [n, 1], >= 1
        p_threshold = torch.where(has_p, candidates.gather(1, num_keep - 1), neg_inf)  # [n, 1]
        return torch.maximum(k_threshold, p_threshold)

    @staticmethod
    def logprobs_of(
        logits: torch.Tensor,
        params: list[SamplingParams],
        token_ids: torch.Tensor,
        token_list: list[int],
    ) -> list[TokenLogprobs | None]:
        """`logits`: [rows, vocab] float32 raw; `token_ids`: [rows] chosen (and as a list)."""
        out: list[TokenLogprobs | None] = [None] * len(params)
        wanted = [i for i, p in enumerate(params) if p.logprobs is not None]
        if not wanted:
            return out
        index = torch.tensor(wanted, device=logits.device)
        logprobs = torch.log_softmax(logits[index], dim=-1)  # [m, vocab]
        chosen = logprobs.gather(1, token_ids[index][:, None])[:, 0].tolist()  # [m]
        num_top = max(params[i].logprobs or 0 for i in wanted)
        top_values: list[list[float]] = [[] for _ in wanted]
        top_ids: list[list[int]] = [[] for _ in wanted]
        if num_top > 0:
            top = logprobs.topk(min(num_top, logprobs.shape[1]), dim=-1)  # [m, num_top]
            top_values, top_ids = top.values.tolist(), top.indices.tolist()
        for j, i in enumerate(wanted):
            n = params[i].logprobs or 0
            out[i] = TokenLogprobs(
                token_id=token_list[i],
                logprob=chosen[j],
                top=tuple(zip(top_ids[j][:n], top_values[j][:n])),
            )
        return out
