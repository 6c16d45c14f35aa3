"""The engine loop's last words: when it stops or breaks, every request still open ends.

These drive `EngineLoop` directly (no HTTP) with a real engine on the default model.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.errors import StepFailed
from strata.sampling import SamplingParams
from strata.server import engine_loop
from strata.server.engine_loop import EngineLoop
from strata.server.errors import NotReady, ServerError
from strata.server.handle import Admitted, Failed, RequestHandle, is_final
from strata.server.metrics import ServerMetrics

LONG = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)


def load_engine() -> Engine:
    config = EngineConfig(dtype="bfloat16", max_context=256, batch=1, kv_pool_tokens=256, kv_chunk=16)
    return Engine(config, progress=False)


async def started(loop: EngineLoop) -> list[int]:
    loop.start(asyncio.get_running_loop())
    for _ in range(6000):
        if loop.state == "ready":
            return loop.info.tokenizer.encode("Tell me about the sea, please.")
        assert loop.state == "loading", loop.load_error
        await asyncio.sleep(0.01)
    raise AssertionError("the model did not load")


async def final_event(handle: RequestHandle):
    while True:
        event = await handle.next(timeout=60)
        assert event is not None, f"{handle.request_id} got no final event"
        if is_final(event):
            return event


def test_stop_ends_running_and_waiting_requests():
    async def main():
        loop = EngineLoop(load_engine, "m", ServerMetrics(), max_waiting=8)
        prompt = await started(loop)
        handles = [loop.submit(prompt, LONG) for _ in range(4)]  # 2 lanes: 2 run, 2 wait
        assert isinstance(await handles[0].next(timeout=60), Admitted)
        await asyncio.to_thread(loop.stop)
        for event in [await final_event(h) for h in handles]:
            assert isinstance(event, Failed) and isinstance(event.error, NotReady)
            assert event.error.code == "shutting_down"
        assert loop.state == "stopped" and loop.snapshot.pool.num_chunks_held == 0
        with pytest.raises(NotReady):
            loop.submit(prompt, LONG)

    asyncio.run(main())


def test_a_broken_loop_ends_running_and_queued_requests(monkeypatch):
    """The loop breaks (a fault after a step) while one request runs and another has just
    been sent (still queued, or finished by the lost step): both end with the server's error."""
    broken = threading.Event()
    take_snapshot = Engine.snapshot

    def breaking_snapshot(engine):
        if broken.is_set():
            raise RuntimeError("injected fault")
        return take_snapshot(engine)

    monkeypatch.setattr(Engine, "snapshot", breaking_snapshot)

    async def main():
        loop = EngineLoop(load_engine, "m", ServerMetrics(), max_waiting=8)
        prompt = await started(loop)
        running = loop.submit(prompt, LONG)
        assert isinstance(await running.next(timeout=60), Admitted)
        broken.set()
        short = loop.submit(prompt + [13], SamplingParams(temperature=0, max_tokens=1))
        for handle in (running, short):
            event = await final_event(handle)
            assert isinstance(event, Failed) and isinstance(event.error, ServerError)
        assert loop.state == "failed"
        with pytest.raises(NotReady):
            loop.submit(prompt, LONG)
        loop.stop()

    asyncio.run(main())


def test_a_failed_step_ends_its_requests_and_the_loop_serves_on():
    """A fault in the forward ends the request that step carried with a StepFailed (a short
    message and an id), frees its chunks, and the loop keeps serving: a parked conversation
    is still reused by its follow-up."""
    engines: list[Engine] = []
    fault = threading.Event()

    def load() -> Engine:
        engine = load_engine()
        forward = engine._runner.model.forward

        def faulty(*args, **kwargs):
            if fault.is_set():
                fault.clear()
                raise RuntimeError("injected fault")
            return forward(*args, **kwargs)

        engine._runner.model.forward = faulty
        engines.append(engine)
        return engine

    async def main():
        loop = EngineLoop(load, "m", ServerMetrics(), max_waiting=8)
        prompt = await started(loop)
        first = loop.submit(prompt, SamplingParams(temperature=0, max_tokens=4))
        done = await final_event(first)
        assert done.finish_reason == "length"
        held_by_first = loop.snapshot.pool.num_chunks_held

        running = loop.submit(prompt[:3] + [13, 14], LONG)
        assert isinstance(await running.next(timeout=60), Admitted)
        fault.set()
        event = await final_event(running)
        assert event.finish_reason == "error" and isinstance(event.error, StepFailed)
        assert "injected" not in str(event.error) and event.error.error_id.startswith("err-")
        assert loop.state == "ready"
        for _ in range(200):  # the snapshot follows the step that posted the event
            if loop.snapshot.pool.num_chunks_held == held_by_first:
                break
            await asyncio.sleep(0.01)
        assert loop.snapshot.pool.num_chunks_held == held_by_first  # only the parked turn

        follow = loop.submit(prompt + [13], SamplingParams(temperature=0, max_tokens=2))
        admitted = await follow.next(timeout=60)
        assert isinstance(admitted, Admitted) and admitted.num_cached_tokens == len(prompt)
        assert (await final_event(follow)).finish_reason == "length"
        assert engines[0]._scheduler.counters.num_failed_steps == 1
        await asyncio.to_thread(loop.stop)

    asyncio.run(main())
