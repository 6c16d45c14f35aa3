"""Running requests to the end on an engine, for the property tests of tests/model/."""

from __future__ import annotations

from collections.abc import Callable

from strata.engine.engine import Engine
from strata.kv.table import chunks_for
from strata.sampling import SamplingParams
from tests.checks import check_scheduler


def run_requests(engine: Engine, prompts: list[list[int]], params: SamplingParams,
                 after_step: Callable[[Engine], None] | None = None) -> list[list[int]]:
    """The tokens of `prompts`, all submitted at once; the scheduler's invariants (and
    `after_step`) are checked after every step."""
    for request_id in list(engine._requests):  # left over by an earlier failing example
        engine.cancel(request_id)
    ids = [engine.submit(p, params) for p in prompts]
    tokens = {i: [] for i in ids}
    while engine.has_work:
        for out in engine.step():
            assert out.error is None and not out.truncated
            tokens[out.request_id].extend(out.new_token_ids)
        check_scheduler(engine._scheduler)
        if after_step is not None:
            after_step(engine)
    return [tokens[i] for i in ids]


def tables_are_tight(engine: Engine) -> None:
    """Every conversation holds the chunks its cells need, and one more cell's while it decodes
    (as without drafts: rejected drafts' chunks went back); a prefilling one holds its prompt's."""
    prefilling = {id(s.conv) for s in engine._scheduler.seqs.values() if s.is_prefilling}
    c = engine._layout.chunk_size
    for conv in engine._scheduler.cache:
        if id(conv) not in prefilling:
            n = conv.table.num_cells
            assert chunks_for(n, c) <= len(conv.table.chunk_ids) <= chunks_for(n + conv.is_active, c)
        assert conv.draft_cells <= conv.num_cells


def move_or_park(engine: Engine, action: str) -> None:
    """The one idle conversation in a lane moves to the next lane, or parks."""
    lane = next(ln.index for ln in engine._scheduler.lanes if ln.conv is not None)
    if action == "move":
        engine.move(lane, (lane + 1) % len(engine._scheduler.lanes))
    elif action == "park":
        engine.park(lane)
