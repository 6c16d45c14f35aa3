"""A row's path is chosen by its kind (models/rows.py), on the default serving path: bfloat16,
`--weights auto` (4-bit projections and an int8 head for decode rows, dense for prompt rows).

- The same chat sent twice at temperature 0 answers the same, every token: the second time only
  its last token is computed (the rest cached), as the first time: a prompt's sampling row reads
  the 4-bit projections (or, on AMX, the dense ones) and the head's small form whatever rows
  share its step (their kernels compute each row by itself), and that row attends as one query over all its cells in both
  (runner/inputs.py `_sample_read`), so it is bit-identical to the cold prompt's last row; the
  decode steps after it then read the same cells at the same positions.
- Each projection and the head read decode rows (up to their limit) and sampling rows in their
  small form, the other rows dense, each row as it would be read alone; where the dense GEMM's
  rows are alike at any row count (strata's AMX kernel) a projection reads sampling rows dense.
- A step with a prompt piece beside a decoding lane computes the lane's row as a decode-only
  step does (4-bit) and the piece's rows as a prompt-only step does (dense), whichever of them
  is the longer.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.models.rows import RowKinds, linear, rows_alike
from strata.sampling import SamplingParams
from strata.step import LaneWork, StepOutput

# Chats whose second answer differed from the first when a cached prompt's last token was
# computed as a decode row (on a Sapphire Rapids guest: the first three, at the 2nd to 5th token),
# or, on an AVX-512 EPYC, when a cold prompt's last row attended within its piece (the 3rd, 2nd).
CHATS = ["What color is a ruby? Answer in one sentence.", "Name a color.", "Write a haiku about tides.",
         "Think of a color and tell me about it.", "Why is the sky blue?", "Give me a word that rhymes with cat.",
         "Summarize: " + "The tide came in over the flat grey sand, and the gulls cried. " * 12]
NEW = 16  # tokens of each answer compared


@pytest.fixture(scope="module")
def engine(gguf_path) -> Engine:
    return Engine(EngineConfig(model=gguf_path, dtype="bfloat16", weights="auto", max_context=512, batch=1,
                               spec="off"), progress=False)


def prompt_state(engine: Engine, request_id: str, ids: list[int]) -> LaneWork:
    """Reads `ids` in as `request_id`'s prompt, nothing sampled; returns the decode row that
    would follow it (its next token is the prompt's last id again: any token will do)."""
    scheduler, runner = engine._scheduler, engine._runner
    scheduler.add(request_id, ids)
    while scheduler.seqs.get(request_id) is None or scheduler.seqs[request_id].is_prefilling:
        plan = scheduler.schedule()
        runner.copy_cells(plan.copies)
        runner.all_logits(plan.work)
        scheduler.commit(plan, StepOutput())
    seq = scheduler.seqs[request_id]
    chunk_size = engine._kv.chunk_size
    assert seq.conv.num_cells % chunk_size, "the decode row's cell is in the table's last chunk"
    return LaneWork(seq.lane, request_id, (ids[-1],), seq.conv.num_cells, tuple(seq.conv.table.chunk_ids), True)


def greedy(engine: Engine, ids: list[int]) -> tuple[list[int], int]:
    """`NEW` greedy tokens after `ids`, and how many of its prompt tokens were cached."""
    request_id = engine.submit(ids, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True))
    outs = list(engine.stream(request_id))
    return [t for o in outs for t in o.new_token_ids], outs[-1].num_cached_tokens


def test_a_retried_chat_answers_as_it_did_cold(engine, quant_ops):
    """The same chat sent twice at temperature 0: the second time its prompt but the last token
    is cached, and its whole greedy answer is the first's (bfloat16, two runs on this CPU)."""
    for chat in CHATS:
        engine._scheduler.clear_cache()
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": chat}])
        cold, cold_cached = greedy(engine, ids)
        retry, cached = greedy(engine, ids)
        assert (cold_cached, cached) == (0, len(ids) - 1)
        assert retry == cold, (chat, engine.tokenizer.decode(cold), engine.tokenizer.decode(retry))


@pytest.mark.parametrize("piece", [3, 40])  # fewer rows than the 4-bit limit together, and more
def test_a_mixed_step_computes_each_row_by_its_kind(engine, quant_ops, piece, monkeypatch):
    scheduler, runner, model = engine._scheduler, engine._runner, engine._model
    assert model.quant_max_rows is not None and 1 + 3 <= model.quant_max_rows < 1 + 40
    scheduler.clear_cache()
    tok = engine.tokenizer
    decode = prompt_state(engine, "a", tok.encode_chat([{"role": "user", "content": "Name a color."}]))
    scheduler.add("b", tok.encode("The tide came in over the flat grey sand, and the gulls " * 4))
    plan = scheduler.schedule()
    (prompt,) = [dataclasses.replace(w, token_ids=w.token_ids[:piece]) for w in plan.work if w.request_id == "b"]
    assert prompt.prompt and prompt.start == 0
    try:
        alone = torch.cat([runner.all_logits((decode,)), runner.all_logits((prompt,))])
        mixed = runner.all_logits((decode, prompt))  # rows: the decode row, then the piece's
        for layer in model.layers:  # a one-call form keeps the forms it was built with: none here
            monkeypatch.setattr(layer, "fused", None)
            for lin in (layer.qkv, layer.o, layer.gate_up, layer.down):
                monkeypatch.setattr(lin, "max_rows", 0)
        monkeypatch.setattr(model.lm_head, "max_rows", 0)
        dense = torch.cat([runner.all_logits((decode,)), runner.all_logits((prompt,))])
    finally:
        scheduler.abort("a")
        scheduler.abort("b")
    tol = 1e-3 * alone.abs().max().item()  # the same path: summation order at most
    four_bit = (alone[0] - dense[0]).abs().max().item()
    print(f"piece {piece}: decode row mixed vs alone {(mixed[0] - alone[0]).abs().max().item():.4f}, "
          f"prompt rows {(mixed[1:] - alone[1:]).abs().max().item():.4f}, 4-bit vs dense {four_bit:.4f}, tol {tol:.4f}")
    # the decode row's 4-bit path, told apart from the dense one (with the q8x8 head, the file's own
    # values, it differs by the projections' and activations' rounding: 0.25 against a tol of 0.031
    # on a Zen 4 EPYC, where the mixed and alone rows agree exactly)
    assert four_bit > 5 * tol
    assert (mixed[0] - alone[0]).abs().max().item() <= tol
    assert (mixed[1:] - alone[1:]).abs().max().item() <= tol
    assert (alone[1:] - dense[1:]).abs().max().item() <= tol  # prompt rows: dense in any step


def test_sampling_rows_and_decode_rows_read_the_small_forms(engine):
    """Rows of a step [decode rows, prompt rows with sampling rows among them]: every row equals
    what its own form gives it alone, whatever the decode-row count (within the 4-bit limit or
    past it, where decode rows read the dense weight); sampling rows read the dense weight where
    its GEMM's rows are alike at any row count (the AMX kernel), and are then still equal to
    themselves alone. bfloat16 is safe on any CPU here: each
    row is compared with the same kernel's output on this CPU, never with fixed values."""
    model = engine._model
    g = torch.Generator().manual_seed(3)
    layer = model.layers[2]
    rows = 12
    for lin in (layer.qkv, layer.gate_up):
        x = torch.randn(rows, lin.weight.shape[1], generator=g).bfloat16()
        for d, alone in [(0, (7, 11)), (3, (11,)), (3, (5, 11)), (lin.max_rows + 1, (11,)), (rows - 1, (11,))]:
            y = lin(x, RowKinds(d, 0, alone))
            first = d if d <= lin.max_rows else 0
            for r in range(rows):
                # a sampling row reads dense in its piece where the dense GEMM's rows are alike
                small = r < first or (r in alone and not rows_alike(lin.weight))
                want = lin._four_bit(x[r : r + 1]) if small else linear(x[first:], lin.weight, lin.bias)[r - first][None]
                assert torch.equal(y[r], want[0]), (d, alone, r, small)
    head = model.lm_head
    assert head.max_rows is not None
    h = torch.randn(5, model.cfg.hidden_size, generator=g).bfloat16()
    for d in (0, 2, 4):  # logits rows [0, d) decode rows', the rest prompts' sampling rows
        y = head(h, RowKinds(d, d, alone_logits=True))
        assert all(torch.equal(y[r], head.small(h[r : r + 1])[0]) for r in range(5))
    y = head(h, RowKinds(2, 2))  # every prompt row's logits (not sampling rows): dense
    assert torch.equal(y[2:], linear(h[2:], head.weight))
