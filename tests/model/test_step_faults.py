"""Fault injection on a real (tiny, float32) model: a step whose execute fails ends only
the requests it carried, gives back their chunks, and leaves parked conversations and
waiting requests as they were; the engine then carries on with the same greedy tokens
as an engine that never failed. The pool is compared with a fresh run by its free list
and refcounts (a scan), not by counters.
"""

from __future__ import annotations

import logging

import pytest

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.errors import StepFailed
from strata.sampling import SamplingParams
from tests.checks import check_scheduler

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
P = [5, 17, 923, 88, 1200, 41, 7, 7, 301, 12, 99, 640, 3, 18, 250, 777, 31, 2024, 6]  # 19 tokens
A = [44, 1001, 9, 9, 73]
B = [600, 601, 602, 603, 604, 605, 606, 607]
W = [12, 13, 14]


def make_engine(model_dir: str) -> Engine:
    cfg = EngineConfig(model=model_dir, dtype="float32", max_context=128, kv_chunk=16,
                       kv_pool_tokens=16 * 16, batch=1, prefill_chunk=13)
    return Engine(cfg, progress=False)


def run_all(engine: Engine) -> dict:
    outs = {}
    for out in engine.run_until_done():
        outs.setdefault(out.request_id, []).append(out)
        check_scheduler(engine._scheduler)
    return outs


def tokens(outs: list) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def pool_scan(engine: Engine) -> tuple:
    pool = engine._layout.pool
    return [pool.refcount(i) for i in range(pool.num_total)], pool.free_ids()


def conversations(engine: Engine) -> list[tuple[int, ...]]:
    return sorted(tuple(c.token_ids) for c in engine._scheduler.cache)


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    """A fresh engine that never failed: P's turn, then the greedy tokens of each request."""
    engine = make_engine(tiny_llama_dir)
    engine.submit(P, GREEDY, "p")
    p_out = tokens(run_all(engine)["p"])
    after_p = (pool_scan(engine), conversations(engine))
    alone = {}
    for name, prompt in (("a", A), ("b", B), ("w", W), ("p2", P + p_out + [50, 51]), ("br", P[:10] + [9])):
        fresh = make_engine(tiny_llama_dir)
        fresh.submit(prompt, GREEDY, name)
        alone[name] = tokens(run_all(fresh)[name])
    return p_out, after_p, alone


def engine_after_p(model_dir: str, reference) -> Engine:
    """A fresh engine that has run P's turn, checked against the reference run."""
    p_out, after_p, _ = reference
    engine = make_engine(model_dir)
    engine.submit(P, GREEDY, "p")
    assert tokens(run_all(engine)["p"]) == p_out
    assert (pool_scan(engine), conversations(engine)) == after_p
    return engine


def fail_on_call(monkeypatch, obj, name: str, when) -> list[int]:
    """Makes `obj.name` raise on the calls for which `when(call number, args)` is true."""
    real = getattr(obj, name)
    calls = [0]

    def faulty(*args, **kwargs):
        calls[0] += 1
        if when(calls[0], args):
            raise RuntimeError("injected fault: device lost")
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, name, faulty)
    return calls


def test_a_fault_in_the_forward_ends_only_that_steps_requests(tiny_llama_dir, reference, monkeypatch, caplog):
    p_out, after_p, alone = reference
    engine = engine_after_p(tiny_llama_dir, reference)

    engine.submit(A, GREEDY, "a")
    engine.submit(B, GREEDY, "b")
    engine.submit(W, GREEDY, "w")  # waits: a and b take both lanes (p gives way, parked)
    first = engine.step()  # a and b read their prompts; their first tokens come out
    assert {o.request_id for o in first} == {"a", "b"}
    calls = fail_on_call(monkeypatch, engine._runner.model, "forward", lambda n, _: n == 1)
    with caplog.at_level(logging.ERROR, logger="strata"):
        failed = engine.step()
    assert calls[0] == 1
    assert sorted(o.request_id for o in failed) == ["a", "b"]
    for o in failed:
        assert o.finished and o.finish_reason == "error" and isinstance(o.error, StepFailed)
        assert o.error.error_id in caplog.text  # the details are in the log under its id
        assert "device lost" not in str(o.error)  # the client sees a short message only
    assert set(engine._requests) == {"w"} and engine._scheduler.counters.num_failed_steps == 1
    check_scheduler(engine._scheduler)

    outs = run_all(engine)  # the engine carries on: w was never touched
    assert tokens(outs["w"]) == alone["w"]
    assert (pool_scan(engine), conversations(engine)) != after_p  # w's turn is cached too
    engine._scheduler.clear_cache()
    engine.submit(P, GREEDY, "p")
    assert tokens(run_all(engine)["p"]) == p_out
    assert pool_scan(engine) == after_p[0]  # a, b and w left nothing behind

    engine.submit(P + p_out + [50, 51], GREEDY, "p2")
    engine.submit(A, GREEDY, "a")
    outs = run_all(engine)
    assert tokens(outs["p2"]) == alone["p2"] and tokens(outs["a"]) == alone["a"]


def test_a_fault_in_the_copies_keeps_the_source_and_frees_the_branch(tiny_llama_dir, reference, monkeypatch):
    p_out, after_p, alone = reference
    engine = engine_after_p(tiny_llama_dir, reference)

    engine.submit(P[:10] + [9], GREEDY, "br")  # a fork: copies P's partial first chunk
    calls = fail_on_call(monkeypatch, engine._kv, "copy_cells", lambda n, args: bool(args[0]))
    failed = engine.step()
    assert calls[0] == 1
    assert [(o.request_id, o.finish_reason) for o in failed] == [("br", "error")]
    assert isinstance(failed[0].error, StepFailed)
    assert (pool_scan(engine), conversations(engine)) == after_p
    check_scheduler(engine._scheduler)

    monkeypatch.undo()
    engine.submit(P[:10] + [9], GREEDY, "br")
    engine.submit(P + p_out + [50, 51], GREEDY, "p2")
    outs = run_all(engine)
    assert tokens(outs["br"]) == alone["br"] and tokens(outs["p2"]) == alone["p2"]


def test_a_fault_while_extending_a_parked_conversation_keeps_the_turn_it_found(tiny_llama_dir, reference, monkeypatch):
    p_out, after_p, alone = reference
    engine = engine_after_p(tiny_llama_dir, reference)
    engine.park(0)
    engine.submit(P + p_out + [50, 51], GREEDY, "p2")
    fail_on_call(monkeypatch, engine._runner.model, "forward", lambda n, _: n == 1)
    failed = engine.step()
    assert [(o.request_id, o.finish_reason) for o in failed] == [("p2", "error")]
    assert (pool_scan(engine), conversations(engine)) == after_p  # the cached turn is intact
    monkeypatch.undo()
    engine.submit(P + p_out + [50, 51], GREEDY, "p2")
    outs = run_all(engine)
    assert outs["p2"][-1].num_cached_tokens == len(P) + len(p_out) - 1  # reused, not recomputed
    assert tokens(outs["p2"]) == alone["p2"]
