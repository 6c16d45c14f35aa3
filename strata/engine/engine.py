"""The engine: the one interface every front end uses (HTTP, CLI, chat, Python API, cluster).

- requests: `submit`, `stream` (one request's outputs, stepping the engine), `cancel`;
- steps: `step` (plan, execute, commit; the server's engine thread drives it), with
  `last_admissions` telling which requests the step admitted;
- views: `info` (fixed once loaded), `snapshot()` (pool, lanes, counters) and `picture()`
  (the Monitor's view of every chunk), `held_conversations()`;
- lanes: `move`, `park`, `restore`, `erase_lane`; session files off the step path:
  `begin_save_session`, `begin_restore_session` (a SessionJob); `save_session`, `restore_session`.

Its parts (scheduler, layout, K/V storage, ring, runner, model) are private: nothing
outside `engine/` reaches them (tests/unit/test_seams.py checks it). Not thread-safe: one
thread calls it.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence

import torch

from strata.config import EngineConfig
from strata.detok import IncrementalDetokenizer
from strata.engine.build import build_parts
from strata.engine.choices import HeldChoices
from strata.engine.conversation import Conversation
from strata.engine.info import EngineInfo
from strata.engine.picture import PoolPicture, take_picture
from strata.engine.prompt import Prompt, check_prompt
from strata.engine.request import RequestOutput, RequestState
from strata.engine.session import SessionFiles, SessionRestored, SessionSaved
from strata.engine.session_jobs import SessionJob
from strata.engine.snapshot import EngineSnapshot, take_snapshot
from strata.errors import ContextLengthExceeded, PoolFullError, RequestError, StepFailed, new_error_id
from strata.kv.table import chunks_for
from strata.loader import ModelSource
from strata.logit_controls import LogitControls
from strata.models.fused import kernel_paths
from strata.sampler import make_generator
from strata.sampling import SamplingParams
from strata.step import Admission, StepOutput, StepPlan

import logging

log = logging.getLogger("strata")


class Engine:
    def __init__(self, config: EngineConfig, source: ModelSource | None = None, progress: bool = True):
        self.config = config
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        parts = build_parts(config, source, progress)
        self._scheduler = parts.scheduler
        self._layout = parts.layout
        self._kv = parts.kv
        self._ring = parts.ring
        self._model = parts.model
        self._runner = parts.runner
        cfg = self.model_config = parts.model_config
        self.tokenizer = parts.tokenizer
        self.max_context = parts.max_context
        self.info = EngineInfo(parts.tokenizer, cfg.name, parts.max_context, cfg.vocab_size, parts.fingerprint,
                               config.num_lanes, parts.layout.chunk_size, parts.kv.bytes_per_cell,
                               parts.layout.name, parts.loaded_from_cache,
                               kernel_paths(parts.model.ops, getattr(parts.model, "weight_forms", None)))
        self._sessions = SessionFiles(parts.scheduler, parts.kv, parts.fingerprint, cfg.vocab_size, self.retry_after)
        self._stop_token_ids = frozenset(cfg.eos_token_ids) | frozenset(self.tokenizer.eos_token_ids)
        self._requests: dict[str, RequestState] = {}
        self._undelivered: defaultdict[str, deque[RequestOutput]] = defaultdict(deque)  # for `stream`
        self._held_choices = HeldChoices()
        self._ids = itertools.count()
        self._step_seconds: deque[float] = deque(maxlen=32)
        self.last_admissions: tuple[Admission, ...] = ()  # the requests the last step admitted

    # ---- requests ---------------------------------------------------------------------
    def submit(self, prompt: str | Sequence[int] | Prompt, params: SamplingParams, request_id: str | None = None,
               arrival: float | None = None) -> str:
        """Queue a request; raises RequestError (a prompt `check_prompt` refuses, an id in use).
        A `Prompt` was checked where it entered. `arrival`: when it arrived (time.perf_counter)."""
        request_id = self._register(prompt, params, request_id, arrival)
        state = self._requests[request_id]
        self._scheduler.add(request_id, state.prompt_ids, params.max_tokens)
        return request_id

    def submit_choices(self, prompt: str | Sequence[int] | Prompt, params: Sequence[SamplingParams],
                       request_ids: Sequence[str] | None = None, arrival: float | None = None) -> list[str]:
        """n choices of one prompt (choice i samples with `params[i]`). The first is prefilled; the
        others wait until its prompt's K/V is written, then fork it through the pool (its full
        chunks shared, the partial last one copied), so the prompt is computed once."""
        ids = list(request_ids) if request_ids is not None else [None] * len(params)
        if len(ids) != len(params) or not params:
            raise RequestError(f"{len(params)} choices need as many request ids, got {len(ids)}")
        first = self.submit(prompt, params[0], ids[0], arrival)
        rest: list[str] = []
        try:
            for p, rid in zip(params[1:], ids[1:]):
                rest.append(self._register(self._requests[first].prompt_ids, p, rid, arrival))
        except RequestError:
            for rid in [first, *rest]:
                self.cancel(rid)
            raise
        self._held_choices.hold(first, rest)
        return [first, *rest]

    def _register(self, prompt: str | Sequence[int] | Prompt, params: SamplingParams, request_id: str | None,
                  arrival: float | None) -> str:
        if not isinstance(prompt, Prompt):
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
            prompt = check_prompt(ids, self.max_context, self.model_config.vocab_size)
        prompt_ids = list(prompt.token_ids)
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self._requests:
            raise RequestError(f"request id {request_id!r} is already in use")
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self._stop_token_ids)
        controls = None
        if params.has_logit_controls:
            held_back = frozenset(params.stop_token_ids) | self._stop_token_ids  # what min_tokens holds back
            controls = LogitControls(params, prompt_ids, held_back, self.model_config.vocab_size)
        self._requests[request_id] = RequestState(
            request_id, prompt_ids, params, make_generator(params.seed, self._model.layer_devices[-1]),
            IncrementalDetokenizer(self.tokenizer, params.stop, params.skip_special_tokens, context=prompt_ids),
            stop_ids,
            arrival=time.perf_counter() if arrival is None else arrival,
            drafting=self._scheduler.drafts is not None, controls=controls,
        )
        return request_id

    def cancel(self, request_id: str) -> RequestOutput | None:
        """End a request (waiting or running); its chunks go back to the pool. None: not open."""
        self._undelivered.pop(request_id, None)
        state = self._requests.pop(request_id, None)
        if state is None:
            return None
        self._scheduler.abort(request_id)  # a held choice is not in the scheduler yet: nothing to do
        return state.end("abort")

    def stream(self, request_id: str, stop: Callable[[], bool] | None = None) -> Iterator[RequestOutput]:
        """The outputs of one request until its final one, stepping the engine as needed (other
        requests' outputs wait for their own streams). `stop`, polled between steps: when it
        says so, the request is cancelled and its final (abort) output ends the stream."""
        while True:
            pending = self._undelivered.get(request_id)
            while pending:
                out = pending.popleft()
                yield out
                if out.finished:
                    self._undelivered.pop(request_id, None)
                    return
            if stop is not None and stop():
                out = self.cancel(request_id)
                if out is not None:
                    yield out
                return
            if request_id not in self._requests:
                raise RequestError(f"no open request {request_id!r}")
            outputs = self.step()
            for out in outputs:
                self._undelivered[out.request_id].append(out)
            if not outputs and not self._scheduler.seqs:
                self._sessions.wait_any()  # it waits for a session file in flight: until one ends

    def warm_up(self) -> None:
        """Before serving: the CPU GEMM kernels every prompt piece length up to `prefill_chunk`
        needs, made now rather than by the first step of each length (a long gap in the
        streams decoding beside it)."""
        self._model.warm_up(self.config.prefill_chunk)

    @property
    def has_work(self) -> bool:
        return self._scheduler.has_work or bool(self._held_choices)

    def open_requests(self) -> list[str]:
        """Every request submitted and not yet ended."""
        return list(self._requests)

    # ---- one step -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Plan, execute, commit. A failure in execute ends the step's requests only."""
        t0 = time.perf_counter()
        self._sessions.settle()  # session files whose streams ended: visible (or undone) before planning
        plan = self._scheduler.schedule()
        self.last_admissions = plan.admitted
        outputs = self._settle_admissions(plan)
        if plan.is_empty:
            self._held_choices.release(self._requests, self._scheduler.add)
            return outputs
        params = {w.request_id: self._requests[w.request_id].params for w in plan.work}
        generators = {w.request_id: self._requests[w.request_id].generator for w in plan.work}
        controls = {w.request_id: c for w in plan.work if (c := self._requests[w.request_id].controls) is not None}
        try:
            result = self._runner.execute(plan, params, generators, controls)
        except Exception:  # noqa: BLE001 - any fault in the forward or the copies
            return outputs + self._fail_step(plan)
        outputs += self._commit(plan, result)
        if plan.work:
            self._step_seconds.append(time.perf_counter() - t0)
        self._held_choices.release(self._requests, self._scheduler.add)
        return outputs

    def run_until_done(self) -> list[RequestOutput]:
        outputs = []
        while self.has_work or (self._scheduler.waiting and self._sessions.in_flight):
            if not self.has_work:  # what waits, waits for a session file in flight
                self._sessions.wait_any()
            outputs.extend(self.step())
        return outputs

    def _commit(self, plan: StepPlan, result: StepOutput) -> list[RequestOutput]:
        can_continue = self._scheduler.commit(plan, result)
        for d in result.drafts:
            state = self._requests[d.request_id]
            state.num_drafted += d.num_drafted
            state.num_accepted += d.num_accepted
        outputs = []
        for s in result.sampled:  # a lane that verified drafts: its kept drafts, then one more token
            state = self._requests.get(s.request_id)
            if state is None:  # it finished at an earlier token of this step
                continue
            out = state.on_token(s.token_id, s.logprobs, can_continue[s.request_id])
            if out.finished:
                self._scheduler.finish(s.request_id)
                del self._requests[s.request_id]
            outputs.append(out)
        return outputs

    def _fail_step(self, plan: StepPlan) -> list[RequestOutput]:
        """Ends the requests `plan` carried with a StepFailed naming an id the log repeats."""
        error_id = new_error_id()
        log.exception("step failed (%s): ending requests %s", error_id, ", ".join(plan.request_ids))
        error = StepFailed(error_id)
        return [
            self._requests.pop(request_id).end("error", error=error)
            for request_id in self._scheduler.fail(plan)
        ]

    def _settle_admissions(self, plan: StepPlan) -> list[RequestOutput]:
        now = time.perf_counter()
        outputs = []
        for a in plan.admitted:
            state = self._requests[a.request_id]
            state.admitted, state.num_cached = now, a.num_cached
        for r in plan.refused:
            state = self._requests.pop(r.request_id)
            err = PoolFullError(r.num_chunks_needed, r.num_chunks_free, self.retry_after())
            outputs.append(state.end("error", error=err))
        for request_id in plan.truncated:
            outputs.append(self._requests.pop(request_id).end("length", truncated=True))
        return outputs

    def retry_after(self) -> int:
        """Seconds until a lane is likely to free room: the shortest remaining run, at the recent step rate."""
        step = statistics.median(self._step_seconds) if self._step_seconds else 0.05
        left = [
            (s.params.max_tokens or self.max_context) - len(s.output_ids)
            for s in self._requests.values()
            if s.admitted is not None
        ]
        return max(1, min(60, math.ceil(step * min(left, default=1))))

    # ---- views --------------------------------------------------------------------------
    def snapshot(self) -> EngineSnapshot:
        kv = self._kv
        groups = tuple(kv.group_bytes_per_cell(g) for g in range(len(kv.groups)))
        return take_snapshot(self._scheduler, self._ring, self.retry_after(), kv.bytes_per_cell,
                             getattr(self._model, "bank", None), groups, tuple(len(g.layers) for g in kv.groups))

    def picture(self, step: int) -> PoolPicture:
        """The Monitor's picture of every chunk, lane and parked conversation (`step`: its number)."""
        kv = self._kv
        groups = tuple((g.layers, kv.group_bytes_per_cell(i)) for i, g in enumerate(kv.groups))
        return take_picture(self._scheduler, self.max_context, step, groups)

    def held_conversations(self) -> list[tuple[int, list[int]]]:
        """(conversation id, a copy of its tokens) for every conversation held: running, idle or parked."""
        return [(c.conv_id, list(c.token_ids)) for c in self._scheduler.cache]

    # ---- conversations between lanes -----------------------------------------------------
    def move(self, src_lane: int, dst_lane: int) -> int:
        """Move an idle conversation between lanes; returns the K/V bytes copied (0 when pooled)."""
        return self._runner.copy_cells(self._scheduler.move(src_lane, dst_lane))

    def park(self, lane: int) -> None:
        """Take a lane's idle conversation out of the lane, keeping its K/V in the pool."""
        self._scheduler.park(lane)

    def restore(self, token_ids: Sequence[int], checkpoints: Sequence[int] = (), lane: int | None = None
                ) -> Conversation:
        """Hold a conversation of `token_ids` whose K/V the caller writes into its table next.

        Synthetic long contexts (benchmarks) come in this way. Raises PoolFullError when the
        pool cannot hold it even after idle conversations gave way.
        """
        if not 0 < len(token_ids) <= self.max_context:
            raise ContextLengthExceeded(len(token_ids), self.max_context)
        conv = self._scheduler.restore(list(token_ids), list(checkpoints), lane)
        if conv is None:
            pool = self._layout.pool
            raise PoolFullError(chunks_for(len(token_ids), pool.chunk_size), pool.num_free, self.retry_after())
        return conv

    # ---- session files (engine/session.py: a worker streams the bytes; steps settle them) -----
    def begin_save_session(self, path: str, lane: int | None = None, token_ids: Sequence[int] | None = None,
                           metadata: dict | None = None, idle_only: bool = False,
                           on_record: Callable[[int], None] | None = None) -> SessionJob:
        """Starts writing an idle conversation, with JSON `metadata`, to a session file: lane `lane`'s,
        the one holding the longest prefix of `token_ids`, or (`idle_only`) the idle one sharing most
        with them. `on_record(i)` runs on the worker after record i."""
        tokens = None if token_ids is None else list(token_ids)
        return self._sessions.begin_save(path, lane, tokens, metadata, idle_only, on_record)

    def begin_restore_session(self, path: str, lane: int | None = None,
                              on_record: Callable[[int], None] | None = None) -> SessionJob:
        """Starts holding a session file's conversation again, idle; all or nothing."""
        return self._sessions.begin_restore(path, lane, on_record)

    def save_session(self, path: str, lane: int | None = None, token_ids: Sequence[int] | None = None,
                     metadata: dict | None = None, idle_only: bool = False) -> SessionSaved:
        """`begin_save_session`, then waits for it."""
        return self._sessions.wait(self.begin_save_session(path, lane, token_ids, metadata, idle_only))

    def restore_session(self, path: str, lane: int | None = None) -> SessionRestored:
        """`begin_restore_session`, then waits for it."""
        return self._sessions.wait(self.begin_restore_session(path, lane))

    def settle_sessions(self) -> int:
        """Ends the session files whose streams are done (each step does too); how many ended."""
        return self._sessions.settle()

    def add_session_listener(self, listener: Callable[[], None]) -> None:
        """`listener()` runs on the worker thread each time a session file's stream ends (then
        `settle_sessions` on the engine's thread ends it)."""
        self._sessions.worker.listeners.append(listener)

    def close_sessions(self) -> None:
        """Waits for every session file in flight and settles it (shutting down)."""
        self._sessions.close()

    def abandon_sessions(self, error: BaseException) -> None:
        """Ends every session file in flight with `error`, settling nothing (the engine failed)."""
        self._sessions.abandon(error)

    def erase_lane(self, lane: int) -> int:
        """Drops lane `lane`'s idle conversation (and a restore into it); returns the cells it held."""
        return self._sessions.erase(lane)
