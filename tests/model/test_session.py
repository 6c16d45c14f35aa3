"""Session files round trip: save, drop the conversation (or use a new engine), restore, go on.

Greedy tokens after a restore equal those of the conversation never saved (float32, tiny
random Llama), for both layouts, several chunk sizes (the file's and the restoring pool's
may differ), a cpu,cpu layer split, int8 K/V, and a restore into a lane other than the
one the conversation was saved from. The follow-up reuses every restored cell
(`num_cached`), and a branch from an earlier turn reuses the K/V up to that turn.
"""

from __future__ import annotations

import pytest

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.sampling import SamplingParams
from tests.checks import check_scheduler

MAX_CONTEXT = 160
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
TURN1 = list(range(100, 137))  # 37 tokens: partial chunks at 16 and 64
TURN2 = list(range(700, 719))


def make_engine(model_dir: str, pooled: bool, chunk: int, devices=("cpu",), kv: str = "f32", batch: int = 2) -> Engine:
    pool = {"kv_pool_tokens": (batch + 2) * (-(-MAX_CONTEXT // chunk)) * chunk} if pooled else {}
    cfg = EngineConfig(model=model_dir, dtype="float32", max_context=MAX_CONTEXT, kv_chunk=chunk, batch=batch,
                       prefill_chunk=32, devices=devices, kv=kv, **pool)
    return Engine(cfg, progress=False)


def generate(engine: Engine, prompt: list[int]) -> tuple[list[int], int]:
    request_id = engine.submit(prompt, GREEDY)
    tokens, cached = [], None
    while engine.has_work:
        for out in engine.step():
            assert out.error is None
            if out.request_id == request_id:
                tokens += out.new_token_ids
                cached = out.num_cached_tokens
        check_scheduler(engine._scheduler)
    return tokens, cached


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    """Turn 1, then turn 2 on top of it, in one engine that never saved anything."""
    def run(kv: str) -> tuple[list[int], list[int], list[int]]:
        engine = make_engine(tiny_llama_dir, False, 4096, kv=kv)
        out1, _ = generate(engine, TURN1)
        engine._scheduler.clear_cache()
        out2, _ = generate(engine, TURN1 + out1 + TURN2)
        engine._scheduler.clear_cache()
        branch, _ = generate(engine, TURN1[:20] + TURN2)
        return out1, out2, branch
    return {kv: run(kv) for kv in ("f32", "int8")}


# (saving pool: pooled, chunk, devices; restoring pool: pooled, chunk; K/V dtype)
CASES = [
    ((True, 16, ("cpu",)), (True, 16), "f32"),
    ((False, 64, ("cpu",)), (False, 64), "f32"),
    ((True, 64, ("cpu",)), (False, 16), "f32"),
    ((False, 16, ("cpu",)), (True, 4096), "f32"),
    ((True, 16, ("cpu", "cpu")), (True, 16), "f32"),
    ((True, 16, ("cpu",)), (False, 64), "int8"),
]


@pytest.mark.parametrize(("saver", "restorer", "kv"), CASES)
def test_round_trip_in_a_new_engine(tiny_llama_dir, reference, tmp_path, saver, restorer, kv):
    out1_ref, out2_ref, branch_ref = reference[kv]
    a = make_engine(tiny_llama_dir, *saver, kv=kv)
    out1, _ = generate(a, TURN1)
    assert out1 == out1_ref
    path = str(tmp_path / "s.strata")
    history = TURN1 + out1[:-1]  # the last sampled token was never fed: it has no K/V
    saved = a.save_session(path, token_ids=history)
    assert saved.num_cells == len(history)

    b = make_engine(tiny_llama_dir, restorer[0], restorer[1], devices=saver[2], kv=kv)
    restored = b.restore_session(path, lane=1)  # saved from lane 0, restored into lane 1
    assert (restored.num_cells, restored.lane) == (len(history), 1)
    check_scheduler(b._scheduler)
    out2, cached = generate(b, TURN1 + out1 + TURN2)
    assert out2 == out2_ref
    assert cached == len(history)
    branch, cached = generate(b, TURN1[:20] + TURN2)  # from inside turn 1: forks the restored K/V
    assert branch == branch_ref and cached == 20


def test_round_trip_in_the_same_engine_parked(tiny_llama_dir, reference, tmp_path):
    out1_ref, out2_ref, _ = reference["f32"]
    e = make_engine(tiny_llama_dir, True, 16)
    out1, _ = generate(e, TURN1)
    path = str(tmp_path / "s.strata")
    e.save_session(path, lane=0)
    e._scheduler.clear_cache()
    assert e._layout.pool.num_held == 0
    restored = e.restore_session(path)
    assert restored.lane is None and not restored.verified_first  # parked; nothing had to give way
    conv = e._scheduler.cache.get(restored.conv_id)
    assert conv.checkpoints == [0] and conv.token_ids == TURN1 + out1[:-1]
    out2, cached = generate(e, TURN1 + out1 + TURN2)
    assert out2 == out2_ref and cached == len(TURN1) + len(out1) - 1


def test_a_busy_lane_is_neither_saved_nor_replaced(tiny_llama_dir, tmp_path):
    from strata.errors import LaneBusy

    e = make_engine(tiny_llama_dir, True, 16)
    generate(e, TURN1)
    path = str(tmp_path / "s.strata")
    e.save_session(path, lane=0)
    request_id = e.submit(TURN1 + TURN2, GREEDY)
    e.step()  # a request extends a conversation in this lane now
    lane = e._scheduler.seqs[request_id].lane
    with pytest.raises(LaneBusy):
        e.save_session(str(tmp_path / "t.strata"), lane=lane)
    with pytest.raises(LaneBusy):
        e.save_session(str(tmp_path / "t.strata"), token_ids=TURN1 + TURN2)
    with pytest.raises(LaneBusy):
        e.restore_session(path, lane=lane)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.strata"]


def test_checkpoints_survive_the_file_through_the_python_api(tiny_llama_dir, tmp_path):
    """Two turns saved with LLM.save_session; after LLM.restore_session in a new LLM, the
    conversation keeps both turn starts, and a branch from turn 2's start reuses turn 1."""
    from strata.llm import LLM

    options = dict(dtype="float32", max_context=MAX_CONTEXT, kv_chunk=16, batch=1, kv_pool_tokens=40 * 16)
    a = LLM(tiny_llama_dir, **options)
    first = a.generate(TURN1, GREEDY)[0]
    turn2_start = len(TURN1) + len(first.token_ids) - 1  # the first answer's last token has no K/V yet
    second = a.generate(TURN1 + list(first.token_ids) + TURN2, GREEDY)[0]
    assert second.num_cached_tokens == turn2_start
    path = str(tmp_path / "two-turns.strata")
    saved = a.save_session(path, second.prompt_token_ids + second.token_ids)
    with pytest.raises(ValueError):
        a.save_session(path)

    b = LLM(tiny_llama_dir, **options)
    restored = b.restore_session(path)
    assert restored.num_cells == saved.num_cells == len(second.prompt_token_ids) + len(second.token_ids) - 1
    assert b.engine._scheduler.cache.get(restored.conv_id).checkpoints == [0, turn2_start]
    branch_prompt = list(second.prompt_token_ids[:turn2_start]) + [900, 901, 902]
    branch = b.generate(branch_prompt, GREEDY)[0]
    assert branch.num_cached_tokens == turn2_start
    cold = LLM(tiny_llama_dir, **options).generate(branch_prompt, GREEDY)[0]
    assert branch.token_ids == cold.token_ids and cold.num_cached_tokens == 0
