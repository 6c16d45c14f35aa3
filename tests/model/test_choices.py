"""n choices of one prompt (Engine.submit_choices): the prompt is prefilled once and forked
through the pool (its full chunks shared, exact counts), and each choice equals a separate
request with its seed (float32)."""

from __future__ import annotations

import pytest

from strata.config import EngineConfig
from strata.engine.interface import Engine, collect
from strata.sampling import SamplingParams

CHUNK = 16


@pytest.fixture(scope="module")
def engine(gguf_path):
    return Engine(EngineConfig(model=gguf_path, dtype="float32", max_context=256, batch=3, kv_pool_tokens=1024,
                               kv_chunk=CHUNK, spec="off"), progress=False)


def test_choices_share_the_prompts_chunks_and_equal_separate_requests(engine):
    prompt = engine.tokenizer.encode_chat([{"role": "user", "content": "Write a word about the sea, please, now."}])
    assert len(prompt) % CHUNK not in (0, 1)  # a partial last chunk: forks copy it
    params = [SamplingParams(max_tokens=5, temperature=1.0, seed=7 + i) for i in range(3)]
    ids = engine.submit_choices(prompt, params)
    sched = engine._scheduler
    texts: dict[str, list[str]] = {}
    while len(sched.seqs) < 3:  # choice 0 prefills alone; the others are admitted once its prompt is written
        for out in engine.step():
            texts.setdefault(out.request_id, []).append(out.new_text)
    full = (len(prompt) - 1) // CHUNK  # chunks wholly inside the shared prefix
    tables = [s.conv.table.chunk_ids for s in sched.seqs.values()]
    assert all(t[:full] == tables[0][:full] for t in tables)  # the same chunks, not copies
    assert len({t[full] for t in tables}) == 3  # each its own partial chunk
    stats = sched.stats()
    assert stats.num_chunks_shared == full
    assert stats.num_chunks_held == full + sum(len(t) - full for t in tables)
    assert [s.num_cached for s in sched.seqs.values()][1:] == [len(prompt) - 1] * 2
    while engine.has_work:
        for out in engine.step():
            texts.setdefault(out.request_id, []).append(out.new_text)
    together = ["".join(texts[i]) for i in ids]
    engine._scheduler.clear_cache()
    for i, p in enumerate(params):
        alone = collect(engine.stream(engine.submit(prompt, p))).text
        assert alone == together[i], i


def test_a_held_choice_can_be_cancelled(engine):
    prompt = engine.tokenizer.encode("The sea is")
    ids = engine.submit_choices(prompt, [SamplingParams(max_tokens=3, temperature=0)] * 2)
    assert engine.cancel(ids[1]) is not None
    got = collect(engine.stream(ids[0]))
    assert got.final.finished and not engine.open_requests()
