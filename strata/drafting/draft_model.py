"""The draft model (`--spec draft`): proposes each drafting lane's drafts, greedily, in the runner.

Its K/V lives in the same pool as the target's: a chunk id indexes the same slot of the
draft model's own storage (cells/storage.py, its geometry), and the conversation's chunk table
addresses both, so a move, a park, a fork or pool-full takes the drafter's state along and
counts it. For each lane with draft slots it first feeds the tokens whose draft K/V is not
written yet (`LaneDrafts.feed`: from `feed_start` up to the pending token), all lanes
in one batched forward, then one more batched single-token forward per further draft.
The runner gives the drafter its forward (runner/forward.py), so drafting needs nothing of
the runner's. Drafts are the draft model's argmax: a proposal with all its mass on one token, which
verify's rejection sampling keeps exact (strata/drafting/verify.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from strata.cells.storage import KVStorage
from strata.errors import ConfigError
from strata.kv.pool import KVPool
from strata.loader.model_load import ModelLoad
from strata.models.llama import LlamaModel
from strata.sampler import row_argmax
from strata.step import LaneDrafts, LaneWork

# (work) -> (float32 logits [lanes that sample, vocab], those lanes in row order): the draft
# model's forward over its own K/V, writing the lanes' new cells on the way
DraftForward = Callable[[Sequence[LaneWork]], tuple[torch.Tensor, Sequence[LaneWork]]]


@dataclass(frozen=True)
class DraftModel:
    model: LlamaModel
    kv: KVStorage  # a slot for every chunk of the pool, in the draft model's geometry


class ModelDrafter:
    def __init__(self, draft: DraftModel, forward: DraftForward):
        self.model = draft.model
        self.kv = draft.kv
        self._forward = forward

    def _next_tokens(self, work: Sequence[LaneWork]) -> dict[str, int]:
        """The draft model's argmax after each lane's tokens (its K/V written on the way)."""
        logits, sample_work = self._forward(work)
        best = row_argmax(logits).tolist()
        return {w.request_id: t for w, t in zip(sample_work, best)}

    @torch.inference_mode()
    def propose(self, work: Sequence[LaneWork]) -> dict[str, tuple[int, ...]]:
        """Drafts for every lane of `work` with draft slots (request id -> up to slots tokens)."""
        lanes = [w for w in work if w.draft_slots]
        if not lanes:
            return {}
        feed = [LaneWork(w.lane, w.request_id, w.drafts.feed, w.drafts.feed_start, w.chunk_ids, True) for w in lanes]
        nxt = self._next_tokens(feed)
        drafts = {w.request_id: [nxt[w.request_id]] for w in lanes}
        for j in range(1, max(w.draft_slots for w in lanes)):
            more = [LaneWork(w.lane, w.request_id, (drafts[w.request_id][-1],), w.start + j, w.chunk_ids, True)
                    for w in lanes if w.draft_slots > j]
            for request_id, t in self._next_tokens(more).items():
                drafts[request_id].append(t)
        return {k: tuple(v) for k, v in drafts.items()}


def with_drafts(work: Sequence[LaneWork], drafts: dict[str, tuple[int, ...]]) -> tuple[LaneWork, ...]:
    """`work` with each drafting lane feeding its pending token and its drafts."""
    return tuple(dataclasses.replace(w, token_ids=(w.token_ids[0], *drafts[w.request_id]),
                                     drafts=dataclasses.replace(w.drafts or LaneDrafts(),
                                                                num_drafts=len(drafts[w.request_id])))
                 if w.request_id in drafts else w for w in work)


def check_draft_vocab(load: ModelLoad, path: str, vocab_size: int) -> None:
    """A draft model proposes token ids of the model's own vocabulary: ConfigError otherwise."""
    if load.config.vocab_size != vocab_size:
        raise ConfigError(f"--draft-model {path}: its vocabulary has {load.config.vocab_size} tokens, the model's "
                          f"{vocab_size}: a draft model must share the model's tokenizer")


def load_draft_model(load: ModelLoad, kv_dtype: str, pool: KVPool, max_positions: int, progress: bool,
                     fused: bool = True) -> DraftModel:
    """The draft model `load`, with a K/V storage slot for every chunk of `pool`."""
    cfg = load.config
    model = load.build(max_positions, progress, fused)
    kv = KVStorage(pool.num_total, pool.chunk_size, cfg.num_kv_heads, cfg.head_dim, kv_dtype, model.layer_devices)
    return DraftModel(model, kv)
