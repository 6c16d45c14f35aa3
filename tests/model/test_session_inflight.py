"""Session files off the step path: the engine steps while a save or a restore streams.

A save or restore is held mid-file by its `on_record` hook (the worker thread waits there
until the test releases it), so every assertion is on order, not on time: while it is held,
another lane's stream decodes token after token, and the job is still in flight.

- Save (pooled and reserved): the file equals one saved while idle, and a follow-up's tokens
  equal those of an engine that never saved: pooled, the follow-up extends the saved
  conversation while the save is held (copy-on-write of the shared partial chunk); reserved,
  a branch that would rewrite the lane's cells inside the file's last record waits for it.
- Restore: the conversation is invisible until every record is in; a request that extends it
  waits, then reuses every restored cell; an erase of its lane wins and gives the room back.
"""

from __future__ import annotations

import threading

import pytest

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.errors import RestoreCancelled
from strata.sampling import SamplingParams
from tests.checks import check_scheduler

MAX_CONTEXT = 256
CHUNK = 16
TURN1 = list(range(100, 137))  # 37 tokens: the conversation's last chunk is partial
TURN2 = list(range(700, 719))
SHORT = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
LONG = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
WHILE_HELD = 8  # tokens the other lane decodes while a stream is held mid-file


def make_engine(model_dir: str, pooled: bool) -> Engine:
    pool = {"kv_pool_tokens": 48 * CHUNK} if pooled else {}
    cfg = EngineConfig(model=model_dir, dtype="float32", max_context=MAX_CONTEXT, kv_chunk=CHUNK, batch=1,
                       prefill_chunk=64, spec="off", **pool)
    return Engine(cfg, progress=False)


class Gate:
    """An `on_record` hook that holds the worker after record `at` until `release` is set."""

    def __init__(self, at: int = 1):
        self.at, self.reached, self.release = at, threading.Event(), threading.Event()

    def __call__(self, i: int) -> None:
        if i == self.at:
            self.reached.set()
            assert self.release.wait(120), "the test never released the stream"


class Outputs:
    """Steps `engine`, collecting every request's tokens (and checking the scheduler after each step)."""

    def __init__(self, engine: Engine):
        self.engine, self.tokens, self.cached, self.finished = engine, {}, {}, set()

    def step(self) -> None:
        for out in self.engine.step():
            assert out.error is None, out.error
            self.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            self.cached[out.request_id] = out.num_cached_tokens
            if out.finished:
                self.finished.add(out.request_id)
        check_scheduler(self.engine._scheduler)

    def until(self, done) -> None:
        for _ in range(2000):
            if done():
                return
            self.step()
        raise AssertionError("the engine never got there")

    def count(self, request_id: str) -> int:
        return len(self.tokens.get(request_id, []))


def first_turn(engine: Engine) -> list[int]:
    """TURN1 answered in lane 0; returns the conversation's tokens (idle in lane 0)."""
    outputs = Outputs(engine)
    rid = engine.submit(TURN1, SHORT)
    outputs.until(lambda: rid in outputs.finished)
    return list(engine._scheduler.lanes[0].conv.token_ids)


def follow_up(history: list[int], pooled: bool) -> list[int]:
    """Pooled: all of the conversation and more (its shared partial chunk is copied on write);
    reserved: a branch inside the file's last record (the lane's cells past it are rewritten)."""
    return (history if pooled else history[:36]) + TURN2


def reference_follow_up(model_dir: str, pooled: bool) -> list[int]:
    e = make_engine(model_dir, pooled)
    history = first_turn(e)
    outputs = Outputs(e)
    rid = e.submit(follow_up(history, pooled), SHORT)
    outputs.until(lambda: rid in outputs.finished)
    return outputs.tokens[rid]


@pytest.mark.parametrize("pooled", [True, False], ids=["pooled", "reserved"])
def test_a_stream_decodes_while_a_save_is_held_and_the_file_equals_an_idle_save(tiny_llama_dir, tmp_path, pooled):
    e = make_engine(tiny_llama_dir, pooled)
    history = first_turn(e)
    idle = e.save_session(str(tmp_path / "idle.strata"), lane=0)
    outputs = Outputs(e)
    other = e.submit(list(range(300, 340)), LONG)  # lane 1
    outputs.until(lambda: outputs.count(other) >= 2)
    gate = Gate(at=1)
    job = e.begin_save_session(str(tmp_path / "held.strata"), lane=0, on_record=gate)
    assert job.num_records == 3 and gate.reached.wait(60)
    follow = e.submit(follow_up(history, pooled), SHORT)  # writes the conversation being saved
    start = outputs.count(other)
    outputs.until(lambda: outputs.count(other) >= start + WHILE_HELD and (not pooled or follow in outputs.finished))
    assert not job.done and job.records_done == 2  # the save is still held after its second record
    if not pooled:  # the save pins the lane: the branch waits for it
        assert outputs.count(follow) == 0 and [r for r, *_ in e._scheduler.waiting] == [follow]
    gate.release.set()
    saved = e._sessions.wait(job)
    outputs.until(lambda: follow in outputs.finished)
    assert saved.num_cells == idle.num_cells == len(history)
    assert (tmp_path / "held.strata").read_bytes() == (tmp_path / "idle.strata").read_bytes()
    assert outputs.tokens[follow] == reference_follow_up(tiny_llama_dir, pooled)
    assert outputs.cached[follow] == len(follow_up(history, pooled)) - len(TURN2)
    e.cancel(other)
    check_scheduler(e._scheduler)
    assert e._scheduler.stats().num_chunks_session == 0 and not e._scheduler.holds


def test_a_restore_is_invisible_until_done_and_a_request_extending_it_waits(tiny_llama_dir, tmp_path):
    e = make_engine(tiny_llama_dir, pooled=True)
    history = first_turn(e)
    path = str(tmp_path / "chat.strata")
    e.save_session(path, lane=0)
    e._scheduler.clear_cache()
    outputs = Outputs(e)
    other = e.submit(list(range(300, 340)), LONG)
    outputs.until(lambda: outputs.count(other) >= 2)
    gate = Gate(at=1)
    job = e.begin_restore_session(path, on_record=gate)
    assert gate.reached.wait(60)
    follow = e.submit(history + TURN2, SHORT)
    start = outputs.count(other)
    outputs.until(lambda: outputs.count(other) >= start + WHILE_HELD)
    assert not job.done and outputs.count(follow) == 0  # it waits for the restore
    assert all(c.token_ids[: len(history)] != history for c in e._scheduler.cache)  # nothing half visible
    assert e._scheduler.stats().num_chunks_session == 3
    gate.release.set()
    outputs.until(lambda: follow in outputs.finished)
    restored = job.result.result()
    assert restored.num_cells == len(history) and list(restored.token_ids) == history
    assert outputs.cached[follow] == len(history)  # every restored cell reused
    assert outputs.tokens[follow] == reference_follow_up(tiny_llama_dir, True)
    e.cancel(other)
    check_scheduler(e._scheduler)


def test_an_erase_of_its_slot_wins_over_a_restore_in_flight(tiny_llama_dir, tmp_path):
    e = make_engine(tiny_llama_dir, pooled=True)
    history = first_turn(e)
    path = str(tmp_path / "chat.strata")
    e.save_session(path, lane=0)
    e._scheduler.clear_cache()
    free = e._layout.pool.num_free
    gate = Gate(at=0)
    job = e.begin_restore_session(path, lane=1, on_record=gate)
    assert gate.reached.wait(60)
    assert e._layout.pool.num_free == free - 3
    assert e.erase_lane(1) == 0  # the lane held nothing yet: the restore is dropped
    gate.release.set()
    with pytest.raises(RestoreCancelled):
        e._sessions.wait(job)
    assert e._layout.pool.num_free == free and len(e._scheduler.cache) == 0
    assert not e._scheduler.lanes[1].is_pinned
    check_scheduler(e._scheduler)
    assert e.restore_session(path, lane=1).num_cells == len(history)  # the file is untouched
