"""The engine: loads a model, owns lanes, the KV layout, the scheduler and the runner.

`add_request` validates at the edge; `step` runs one scheduled batch and returns what
happened to each request. The server drives `step` from its own thread; the offline
API drives it until every request is done.
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Sequence

import torch

from strata.config import EngineConfig, check_pool_covers_context
from strata.detok import IncrementalDetokenizer
from strata.engine.memory import MemoryPlan, check_memory
from strata.engine.request import RequestOutput, RequestState
from strata.engine.scheduler import Scheduler
from strata.engine.session import SessionRestored, SessionSaved, restore_session, save_session
from strata.errors import ContextLengthExceeded, PoolFullError, RequestError, StepFailed, new_error_id
from strata.kv.layout import KVLayout, PooledLayout
from strata.kv.reserve import ReservedLayout
from strata.cells.ring import KVRing
from strata.kv.ring_rule import round_up
from strata.cells.storage import KVStorage, kv_bytes_per_cell
from strata.kv.table import chunks_for
from strata.loader import ModelSource
from strata.loader.build import TORCH_DTYPES
from strata.loader.model_load import ModelLoad
from strata.models.config import ModelConfig
from strata.models.layers import INT4_MAX_ROWS
from strata.drafting.draft_model import check_draft_vocab, load_draft_model
from strata.drafting.planner import ModelPlanner, NgramPlanner
from strata.runner.runner import ModelRunner
from strata.sampler import make_generator
from strata.sampling import SamplingParams
from strata.step import StepOutput, StepPlan

log = logging.getLogger("strata")


def num_weight_params(cfg: ModelConfig) -> int:
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size
    embed = cfg.vocab_size * cfg.hidden_size
    return embed * (1 if cfg.tie_embeddings else 2) + cfg.num_layers * per_layer


def make_layout(config: EngineConfig, max_context: int) -> KVLayout:
    if config.kv_pool_tokens is not None:
        check_pool_covers_context(config.kv_pool_tokens, max_context, config.kv_chunk)
        return PooledLayout(config.kv_pool_tokens // config.kv_chunk, config.kv_chunk)
    return ReservedLayout(config.num_lanes, max_context, config.kv_chunk)


class Engine:
    def __init__(self, config: EngineConfig, source: ModelSource | None = None, progress: bool = True):
        self.config = config
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        load = ModelLoad(config.model, config.dtype, config.weights, config.devices, source)
        self.model_config = cfg = load.config
        self.tokenizer = load.tokenizer
        self.fingerprint = load.fingerprint
        self.loaded_from_cache = load.from_cache  # the prepared-model cache had this build
        self.max_context = config.max_context or cfg.max_position
        if self.max_context > cfg.max_position:
            log.warning(
                "--max-context %d is beyond the model's trained length %d: quality may drop",
                self.max_context, cfg.max_position,
            )
        self.layout = make_layout(config, self.max_context)
        pool = self.layout.pool
        kv_bytes = pool.num_cells_total * kv_bytes_per_cell(config.kv_dtype, cfg.num_layers, cfg.num_kv_heads,
                                                            cfg.head_dim)
        if config.kv_resident is not None and all(d == "cpu" for d in config.devices):  # the arena is host memory too
            per_cell = kv_bytes_per_cell(config.kv_dtype, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
            kv_bytes += round_up(config.ring_budget, config.page) * per_cell
        weight_elem = torch.empty(0, dtype=TORCH_DTYPES[config.dtype]).element_size()
        weight_bytes = num_weight_params(cfg) * weight_elem
        draft_load = None
        if config.spec == "draft":  # its weights, and its K/V in every chunk of the pool
            draft_load = ModelLoad(config.draft_model, config.dtype, config.weights, config.devices)
            check_draft_vocab(draft_load, config.draft_model, cfg.vocab_size)  # before anything is allocated
            d = draft_load.config
            weight_bytes += num_weight_params(d) * weight_elem
            kv_bytes += pool.num_cells_total * kv_bytes_per_cell(config.kv_dtype, d.num_layers, d.num_kv_heads,
                                                                 d.head_dim)
        check_memory(MemoryPlan(weight_bytes, kv_bytes), config.memory_guard_mib, config.is_pooled)
        self.model = load.build(self.max_context, progress)
        self.ring: KVRing | None = None
        if config.kv_resident is None:
            self.kv = KVStorage(pool.num_total, pool.chunk_size, cfg.num_kv_heads, cfg.head_dim, config.kv_dtype,
                                self.model.layer_devices)
        else:  # the pool in host memory, a ring of pages on each layer's device in front of it
            accelerated = any(d.type != "cpu" for d in self.model.layer_devices)
            self.kv = KVStorage(pool.num_total, pool.chunk_size, cfg.num_kv_heads, cfg.head_dim, config.kv_dtype,
                                [torch.device("cpu")] * cfg.num_layers, pin_memory=accelerated)
            self.ring = KVRing(self.kv, config.ring_sizing, config.kv_evict, config.ring_budget,
                               self.model.layer_devices)
        draft = None
        if draft_load is not None:
            draft = load_draft_model(draft_load, config.kv_dtype, pool, self.max_context, progress)
        self.runner = ModelRunner(self.model, self.kv, self.ring, draft)
        planner = None
        if config.spec != "off":  # drafts never take a step past the 4-bit kernel's rows
            planner_type = ModelPlanner if config.spec == "draft" else NgramPlanner
            planner = planner_type(config.spec_k, self.layout, self.max_context,
                                   INT4_MAX_ROWS if self.model.has_int4 else None)
        self.scheduler = Scheduler(self.layout, config.num_lanes, self.max_context, config.prefill_chunk,
                                   config.prefill_alone, planner)
        self.stop_token_ids = frozenset(cfg.eos_token_ids) | frozenset(self.tokenizer.eos_token_ids)
        self.requests: dict[str, RequestState] = {}
        self._ids = itertools.count()
        self._step_seconds: deque[float] = deque(maxlen=32)

    # ---- requests ---------------------------------------------------------------------
    def add_request(
        self, prompt: str | Sequence[int], params: SamplingParams, request_id: str | None = None
    ) -> str:
        """Queue a request; raises RequestError (empty, or longer than --max-context)."""
        prompt_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not prompt_ids:
            raise RequestError("the prompt is empty", param="prompt")
        if len(prompt_ids) >= self.max_context:
            raise ContextLengthExceeded(len(prompt_ids), self.max_context)
        vocab = self.model_config.vocab_size
        if any(not (0 <= t < vocab) for t in prompt_ids):
            raise RequestError(f"prompt token ids must be in [0, {vocab})", param="prompt")
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in use")
        device = self.model.layer_devices[-1]
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.stop_token_ids)
        self.requests[request_id] = RequestState(
            request_id,
            prompt_ids,
            params,
            make_generator(params.seed, device),
            IncrementalDetokenizer(self.tokenizer, params.stop),
            stop_ids,
            drafting=self.scheduler.drafts is not None,
        )
        self.scheduler.add(request_id, prompt_ids, params.max_tokens)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """Cancel a request; its chunks go back to the pool."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return None
        self.scheduler.abort(request_id)
        return state.end("abort")

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # ---- one step -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Plan, execute, commit. A failure in execute ends the step's requests only."""
        t0 = time.perf_counter()
        plan = self.scheduler.schedule()
        outputs = self._settle_admissions(plan)
        if plan.is_empty:
            return outputs
        params = {w.request_id: self.requests[w.request_id].params for w in plan.work}
        generators = {w.request_id: self.requests[w.request_id].generator for w in plan.work}
        try:
            result = self.runner.execute(plan, params, generators)
        except Exception:  # noqa: BLE001 - any fault in the forward or the copies
            return outputs + self._fail_step(plan)
        outputs += self._commit(plan, result)
        if plan.work:
            self._step_seconds.append(time.perf_counter() - t0)
        return outputs

    def _commit(self, plan: StepPlan, result: StepOutput) -> list[RequestOutput]:
        can_continue = self.scheduler.commit(plan, result)
        for d in result.drafts:
            state = self.requests[d.request_id]
            state.num_drafted += d.num_drafted
            state.num_accepted += d.num_accepted
        outputs = []
        for s in result.sampled:  # a lane that verified drafts: its kept drafts, then one more token
            state = self.requests.get(s.request_id)
            if state is None:  # it finished at an earlier token of this step
                continue
            out = state.on_token(s.token_id, s.logprobs, can_continue[s.request_id])
            if out.finished:
                self.scheduler.finish(s.request_id)
                del self.requests[s.request_id]
            outputs.append(out)
        return outputs

    def _fail_step(self, plan: StepPlan) -> list[RequestOutput]:
        """Ends the requests `plan` carried with a StepFailed naming an id the log repeats."""
        error_id = new_error_id()
        log.exception("step failed (%s): ending requests %s", error_id, ", ".join(plan.request_ids))
        error = StepFailed(error_id)
        return [
            self.requests.pop(request_id).end("error", error=error)
            for request_id in self.scheduler.fail(plan)
        ]

    def _settle_admissions(self, plan: StepPlan) -> list[RequestOutput]:
        now = time.perf_counter()
        outputs = []
        for a in plan.admitted:
            state = self.requests[a.request_id]
            state.admitted, state.num_cached = now, a.num_cached
        for r in plan.refused:
            state = self.requests.pop(r.request_id)
            err = PoolFullError(r.num_chunks_needed, r.num_chunks_free, self.retry_after())
            outputs.append(state.end("error", error=err))
        for request_id in plan.truncated:
            outputs.append(self.requests.pop(request_id).end("length", truncated=True))
        return outputs

    def retry_after(self) -> int:
        """Seconds until a lane is likely to free room: the shortest remaining run, at the recent step rate."""
        step = statistics.median(self._step_seconds) if self._step_seconds else 0.05
        left = [
            (s.params.max_tokens or self.max_context) - len(s.output_ids)
            for s in self.requests.values()
            if s.admitted is not None
        ]
        return max(1, min(60, math.ceil(step * min(left, default=1))))

    # ---- conversations between lanes -----------------------------------------------------
    def move(self, src_lane: int, dst_lane: int) -> int:
        """Move an idle conversation between lanes; returns the K/V bytes copied (0 when pooled)."""
        return self.runner.copy_cells(self.scheduler.move(src_lane, dst_lane))

    def restore(self, token_ids: Sequence[int], checkpoints: Sequence[int] = (), lane: int | None = None):
        """Hold a conversation of `token_ids` whose K/V the caller writes into its table next.

        Session files and synthetic long contexts (benchmarks) come in this way. Raises
        PoolFullError when the pool cannot hold it even after idle conversations gave way.
        """
        if not 0 < len(token_ids) <= self.max_context:
            raise ContextLengthExceeded(len(token_ids), self.max_context)
        conv = self.scheduler.restore(list(token_ids), list(checkpoints), lane)
        if conv is None:
            pool = self.layout.pool
            raise PoolFullError(chunks_for(len(token_ids), pool.chunk_size), pool.num_free, self.retry_after())
        return conv

    def park(self, lane: int) -> None:
        """Take a lane's idle conversation out of the lane, keeping its K/V in the pool."""
        self.scheduler.park(lane)

    # ---- offline helpers ----------------------------------------------------------------
    def run_until_done(self) -> list[RequestOutput]:
        outputs = []
        while self.has_work:
            outputs.extend(self.step())
        return outputs

    @torch.inference_mode()
    def prompt_logits(self, prompt_ids: Sequence[int]) -> torch.Tensor:
        """Float32 logits [tokens, vocab] for every prompt position (tests use it).

        Runs on an idle engine; clears the conversation cache first so nothing is reused,
        and frees its own K/V at the end.
        """
        assert not self.scheduler.seqs, "prompt_logits runs on an idle engine"
        self.scheduler.clear_cache()
        request_id = f"logits-{next(self._ids)}"
        if len(prompt_ids) >= self.max_context:
            raise ContextLengthExceeded(len(prompt_ids), self.max_context)
        self.scheduler.add(request_id, list(prompt_ids))
        rows = []
        while self.scheduler.seqs.get(request_id) is None or self.scheduler.seqs[request_id].is_prefilling:
            plan = self.scheduler.schedule()
            if plan.refused:
                raise PoolFullError(plan.refused[0].num_chunks_needed, plan.refused[0].num_chunks_free, 1)
            self.runner.copy_cells(plan.copies)
            rows.append(self.runner.logits_for(plan.work))
            self.scheduler.commit(plan, StepOutput())
        self.scheduler.abort(request_id)
        return torch.cat(rows)

    # ---- session files ------------------------------------------------------------------
    def save_session(self, path: str, lane: int | None = None, token_ids: Sequence[int] | None = None,
                     metadata: dict | None = None) -> SessionSaved:
        """Writes an idle conversation, with JSON `metadata`, to a session file (engine/session.py)."""
        return save_session(self, path, lane, None if token_ids is None else list(token_ids), metadata)

    def restore_session(self, path: str, lane: int | None = None) -> SessionRestored:
        """Holds a session file's conversation again, idle; all or nothing (engine/session.py)."""
        return restore_session(self, path, lane)
