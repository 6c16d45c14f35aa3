"""The engine loop: one thread owns the engine; asyncio handlers talk to it through queues.

Invariants:
- Only the engine thread touches the engine (it is not thread-safe): it loads the model,
  takes commands from `_inbox` (thread-safe), steps while any request has work, and hands
  each step's events to the asyncio loop with one `call_soon_threadsafe`.
- `_handles` and `_num_active` belong to the asyncio thread; `_owed` (the requests it owes
  a final event, strata/server/owed_finals.py) to the engine thread.
- Every request the engine accepted ends with exactly one final event: a finished
  `RequestOutput` (stop, length, abort, or a refusal carrying `error`) or `Failed`.
- Closing a handle before its final event sends `Cancel`: the engine aborts the request
  before its next step, and the request's chunks go back to the pool.
- Before the final event, `Admitted` comes first once the request holds a lane.
- Every `call` ends: resolved by the engine thread, or failed when it stops or has stopped.
  A session file's worker wakes the engine thread when it ends, to be settled between steps.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable

from strata.engine.interface import Engine, EngineSnapshot, Prompt, RequestOutput, SessionJob
from strata.errors import QueueFullError, StrataError
from strata.sampling import SamplingParams
from strata.server.engine_commands import STOP, WAKE, Add, Call, Cancel
from strata.server.errors import NotReady, ServerError
from strata.server.handle import Admitted, Event, Failed, RequestHandle, is_final
from strata.server.heap import HeapTrim
from strata.server.incidents import incident_id
from strata.server.metrics import ServerMetrics
from strata.server.monitor.watch import PoolWatch
from strata.server.owed_finals import OwedFinals
from strata.server.params import ModelInfo

log = logging.getLogger("strata.server")


class EngineLoop:
    def __init__(
        self,
        load: Callable[[], Engine],
        model_id: str,
        metrics: ServerMetrics,
        max_waiting: int,
        on_load_error: Callable[[BaseException], None] | None = None,
        heap: HeapTrim | None = None,
        tool_call_parser: str = "auto",
        reasoning_format: str = "auto",
    ):
        self._answers = (tool_call_parser, reasoning_format)  # how answers are read (ModelInfo)
        self._load = load
        self._model_id = model_id
        self._metrics = metrics
        self._max_waiting = max_waiting
        self._on_load_error = on_load_error
        self._heap = heap or HeapTrim(None)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        # Written by the engine thread, read anywhere (each is one reference assignment).
        self.state = "loading"  # "loading" | "ready" | "failed" | "stopped"
        self.load_error: BaseException | None = None
        self.info: ModelInfo | None = None
        self.num_lanes = 0
        self.engine_info = None  # EngineInfo, once loaded
        self.snapshot: EngineSnapshot | None = None
        self.pool_watch = PoolWatch()  # pictures of the pool while a monitor watches
        # asyncio thread only.
        self._handles: dict[str, RequestHandle] = {}
        self._num_active = 0  # submitted, not yet final or closed
        # engine thread only.
        self._owed = OwedFinals(metrics)
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]

    # ---- asyncio side --------------------------------------------------------------------
    def start(self, aloop: asyncio.AbstractEventLoop) -> None:
        self._aloop = aloop
        self._thread = threading.Thread(target=self._run, name="strata-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._inbox.put(STOP)
        if self._thread is not None:
            self._thread.join(timeout)

    def check_ready(self) -> ModelInfo:
        if self.state == "ready" and self.info is not None:
            return self.info
        if self.state == "loading":
            raise NotReady("the model is loading; retry shortly")
        if self.state == "failed":
            # A StrataError says what to fix (a missing file, a bad flag); any other
            # exception's text stays in the log, which already has it.
            why = self.load_error if isinstance(self.load_error, StrataError) else None
            raise NotReady(f"the model failed to load: {why or 'see the server log'}", code="model_load_failed",
                           retry_after=60)
        raise NotReady("the server is shutting down", code="shutting_down")

    def check_capacity(self) -> None:
        """QueueFullError when every lane is busy and max_waiting requests wait already.

        Cheap (two integers): handlers call it before tokenizing, so a full server refuses
        a request without rendering its template; `submit` checks again.
        """
        if self._num_active >= self.num_lanes + self._max_waiting:
            retry = self.snapshot.retry_after if self.snapshot is not None else 1
            raise QueueFullError(self._num_active - self.num_lanes, retry)

    def submit(self, prompt: Prompt | list[int], params: SamplingParams) -> RequestHandle:
        """Queue a request; QueueFullError when every lane is busy and max_waiting wait already."""
        return self.submit_choices(prompt, [params])[0]

    def submit_choices(self, prompt: Prompt | list[int], params: list[SamplingParams]) -> list[RequestHandle]:
        """n choices of one prompt (params[i] for choice i), one handle each; the engine
        prefills the prompt once (Engine.submit_choices)."""
        self.check_ready()
        self.check_capacity()
        base = f"{self._prefix}-{next(self._ids)}"
        ids = [base] + [f"{base}.{i}" for i in range(1, len(params))]
        handles = [RequestHandle(request_id, self) for request_id in ids]
        for handle in handles:
            self._handles[handle.request_id] = handle
        self._num_active += len(handles)
        self._inbox.put(Add(tuple(ids), prompt, tuple(params), time.perf_counter()))
        return handles

    async def call(self, fn: Callable[[Engine], object]) -> object:
        """`fn(engine)` on the engine thread between two steps; raises what it raises."""
        self.check_ready()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(Call(fn, future))
        if self._thread is None or not self._thread.is_alive():
            self._fail_calls(NotReady("the server is shutting down", code="shutting_down"))
        return await asyncio.wrap_future(future)

    async def session(self, begin: Callable[[Engine], SessionJob]) -> object:
        """A session file's save or restore: `begin(engine)` on the engine thread, then its result
        once the worker has streamed it (the other lanes step meanwhile)."""
        job = await self.call(begin)
        return await asyncio.wrap_future(job.result)

    def _fail_calls(self, error: Exception) -> None:  # the engine thread is gone: the inbox is dropped
        for command in self._drain(block=False):
            if isinstance(command, Call) and not command.future.done():
                command.future.set_exception(error)

    def wake(self) -> None:  # the engine thread observes once even without work (a monitor, a session file)
        self._inbox.put(WAKE)

    def close(self, handle: RequestHandle) -> None:
        if not handle.done:
            handle.done = True
            self._inbox.put(Cancel(handle.request_id))
        self._forget(handle)

    def _forget(self, handle: RequestHandle) -> None:
        if self._handles.pop(handle.request_id, None) is not None:
            self._num_active -= 1

    def _deliver(self, batch: list[tuple[str, Event]]) -> None:
        for request_id, event in batch:
            handle = self._handles.get(request_id)
            if handle is None:
                continue  # closed: the client is gone
            if is_final(event):
                handle.done = True
                self._forget(handle)
            handle.put(event)

    def _fail_open(self, error: Exception) -> None:  # the engine thread has ended: nothing new arrives
        self._deliver([(request_id, Failed(error)) for request_id in list(self._handles)])

    # ---- engine thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            engine = self._load()
            engine.warm_up()  # kernels for every prompt piece's length, before the first request
        except BaseException as exc:  # noqa: BLE001 - reported on /health and to the CLI
            self.load_error, self.state = exc, "failed"
            if self._on_load_error is not None:
                self._on_load_error(exc)  # the caller reports it
            else:
                log.error("the model failed to load: %s", exc)
            return
        info = engine.info
        self.info = ModelInfo(self._model_id, info.tokenizer, info.max_context, info.vocab_size, info.fingerprint,
                              *self._answers)
        self.num_lanes = info.num_lanes
        self.engine_info = info
        self.snapshot = engine.snapshot()
        engine.add_session_listener(self.wake)  # a session file's stream ended: settle it
        self.state = "ready"
        try:
            self._serve(engine)
        except BaseException as exc:  # a bug: fail every request rather than leave it hanging
            self.load_error, self.state = exc, "failed"
            error = ServerError("the engine loop stopped")
            error.__cause__ = exc
            incident_id(error, "the engine loop, which stopped: every open request ends")
            engine.abandon_sessions(error)
            self._fail_calls(error)
            self._post(self._owed.abandon(engine, error), error)

    def _serve(self, engine: Engine) -> None:
        while True:
            batch: list[tuple[str, Event]] = []
            commands = self._drain(block=not engine.has_work)
            for i, command in enumerate(commands):
                if command is STOP:
                    self._shutdown(engine, batch, commands[i + 1 :])
                    return
                if command is not WAKE:
                    batch += self._apply(engine, command)
            engine.settle_sessions()
            if engine.has_work:
                batch += self._step(engine)
            self.snapshot = engine.snapshot()
            self.pool_watch.observe(engine.picture)
            if batch:
                self._post(batch)
            self._heap.between_steps()

    def _drain(self, block: bool) -> list:
        commands = [self._inbox.get()] if block else []
        while not self._inbox.empty():
            commands.append(self._inbox.get_nowait())
        return commands

    def _apply(self, engine: Engine, command: Add | Cancel | Call) -> list[tuple[str, Event]]:
        if isinstance(command, Call):
            try:
                command.future.set_result(command.fn(engine))
            except Exception as exc:  # noqa: BLE001 - the caller's to report (a bad file is a 400)
                command.future.set_exception(exc)
            return []
        if isinstance(command, Cancel):
            self._owed.cancel(engine, command.request_id)
            return []
        return self._owed.submit(engine, command)

    def _step(self, engine: Engine) -> list[tuple[str, Event]]:
        try:
            outputs = engine.step()  # a fault in execute ends that step's requests in there
        except Exception as exc:  # a fault in planning or committing: the scheduler's state is unknown
            error = ServerError("the engine failed; every open request was ended")
            error.__cause__ = exc
            incident_id(error, "an engine step, outside execute: every open request ends")
            return self._owed.fail_all(engine, error)
        batch: list[tuple[str, Event]] = [(a.request_id, Admitted(a.num_cached)) for a in engine.last_admissions]
        for out in outputs:
            self._observe(out)
            batch.append((out.request_id, out))
        return batch

    def _observe(self, out: RequestOutput) -> None:
        self._metrics.observe(out)
        if out.finished:
            self._owed.discard(out.request_id)

    def _shutdown(self, engine: Engine, batch: list[tuple[str, Event]], unread: list) -> None:
        """Every open request, and every one still queued, ends with a final event."""
        self.state = "stopped"  # before the last events: no submit is accepted after them
        error = NotReady("the server is shutting down", code="shutting_down")
        batch += self._owed.end_all(engine, error)
        batch += [(request_id, Failed(error)) for c in unread if isinstance(c, Add) for request_id in c.request_ids]
        for c in (c for c in unread if isinstance(c, Call)):
            c.future.set_exception(error)
        engine.close_sessions()  # the files in flight complete (or are removed), their callers hear
        self._fail_calls(error)
        self.snapshot = engine.snapshot()
        self._post(batch, error)

    def _post(self, batch: list[tuple[str, Event]], last: Exception | None = None) -> None:
        """Hands `batch` to the asyncio side. `last`: the engine thread is ending; after the
        batch, every request still open there (queued, or whose events were lost) ends with it."""
        try:
            assert self._aloop is not None
            self._aloop.call_soon_threadsafe(self._deliver, batch)
            if last is not None:
                self._aloop.call_soon_threadsafe(self._fail_open, last)
        except RuntimeError:
            pass  # the event loop is closed: nobody is listening any more
