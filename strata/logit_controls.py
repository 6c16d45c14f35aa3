"""A request's logit controls: what changes its logits before the sampler sees them.

In this order, per row (vLLM's order): the grammar's token mask (strata/grammar), min_tokens
(the stop tokens masked while the output is shorter), logit_bias (added), then the penalties:
repetition (HF/vLLM: over the prompt and output, or llama.cpp's last `repeat_last_n` tokens of
them: a positive logit divided by it, a negative one multiplied), frequency and presence
(OpenAI's: over the output only, `- frequency * count - presence * (count > 0)`).

The same `apply` serves the batched sampler's rows, greedy rows and a verify step's rows: a
verify step's row i sees the state after the lane's first i drafts (counts and grammar
advanced by them, then rolled back), so a kept draft was judged exactly as decoding it one
token at a time would have. The state changes only at commit (`accept`, once per token the
engine keeps). Masked tokens get -inf; the sampler's filters never keep them.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence

import torch

from strata.sampling import SamplingParams


class LogitControls:
    """One request's controls and the counts they read. `stop_ids`: the tokens min_tokens holds back."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int], stop_ids: Iterable[int],
                 vocab_size: int):
        self.params = params
        self.vocab_size = vocab_size
        self.num_output = 0
        self.counts: Counter[int] = Counter()  # output token -> occurrences
        last_n = params.repeat_last_n or None
        self.window: deque[int] = deque(prompt_ids[-last_n:] if last_n else prompt_ids, maxlen=last_n)
        self.seen: Counter[int] = Counter(self.window)  # the repetition penalty's tokens
        self.stop_ids = sorted(i for i in set(stop_ids) if 0 <= i < vocab_size)
        self.bias = [(t, b) for t, b in params.logit_bias if t < vocab_size]
        self.matcher = params.grammar.matcher() if params.grammar is not None else None

    # ---- commit ---------------------------------------------------------------------
    def accept(self, token_id: int) -> None:
        """The engine kept `token_id` as the request's next output token."""
        self.num_output += 1
        self.counts[token_id] += 1
        self._push(token_id)
        if self.matcher is not None:
            self.matcher.accept(token_id)

    def _push(self, token_id: int) -> None:
        if self.window.maxlen is not None and len(self.window) == self.window.maxlen:
            old = self.window[0]
            self.seen[old] -= 1
            if not self.seen[old]:
                del self.seen[old]
        self.window.append(token_id)
        self.seen[token_id] += 1

    # ---- before sampling ------------------------------------------------------------
    def apply(self, logits: torch.Tensor, drafts: Sequence[int] = ()) -> None:
        """`logits`: [1 + len(drafts), vocab] float32, changed in place; row i is the
        distribution after the first i drafts."""
        assert logits.shape[0] == len(drafts) + 1
        if self.matcher is not None:
            self.matcher.fill_masks(logits, drafts)
        if not drafts:
            self._apply_row(logits[0], self.counts, self.seen, self.num_output)
            return
        counts, seen = Counter(self.counts), Counter(self.seen)
        window = deque(self.window, maxlen=self.window.maxlen)
        for i in range(len(drafts) + 1):
            self._apply_row(logits[i], counts, seen, self.num_output + i)
            if i < len(drafts):
                d = drafts[i]
                counts[d] += 1
                if window.maxlen is not None and len(window) == window.maxlen:
                    old = window.popleft()
                    seen[old] -= 1
                    if not seen[old]:
                        del seen[old]
                window.append(d)
                seen[d] += 1

    def _apply_row(self, row: torch.Tensor, counts: Counter[int], seen: Counter[int], num_output: int) -> None:
        p, device = self.params, row.device
        if num_output < p.min_tokens and self.stop_ids:
            row[torch.tensor(self.stop_ids, device=device)] = -torch.inf
        if self.bias:
            ids = torch.tensor([t for t, _ in self.bias], device=device)
            row.index_add_(0, ids, torch.tensor([b for _, b in self.bias], device=device, dtype=row.dtype))
        if p.repetition_penalty != 1.0 and seen:
            ids = torch.tensor(list(seen), device=device)
            values = row[ids]
            row[ids] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        if (p.frequency_penalty or p.presence_penalty) and counts:
            ids = torch.tensor(list(counts), device=device)
            occurrences = torch.tensor(list(counts.values()), device=device, dtype=row.dtype)
            row.index_add_(0, ids, -(p.frequency_penalty * occurrences + p.presence_penalty))
