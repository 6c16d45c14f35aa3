"""Drafts in the scheduler, no model: room for drafts comes from free chunks, and what a
verify step rejects goes back at commit (exact chunk ids)."""

from __future__ import annotations

from strata.drafting.adaptive import AdaptiveK
from strata.drafting.planner import LaneSpec, NgramPlanner
from strata.engine.scheduler import Scheduler
from strata.kv.layout import PooledLayout
from strata.step import DraftOutcome, Sampled, StepOutput
from tests.checks import check_scheduler


class FixedDrafter:
    def __init__(self, drafts):
        self.drafts = drafts

    def propose(self, seq, k):
        return list(self.drafts[:k])


def scheduler(num_chunks: int = 6) -> Scheduler:
    layout = PooledLayout(num_chunks, 4)
    s = Scheduler(layout, num_lanes=1, max_context=64, prefill_chunk=16, drafts=NgramPlanner(4, layout, 64))
    s.drafts.drafter = FixedDrafter([50, 51, 52, 53])
    return s


def prefill(s: Scheduler) -> None:
    s.add("a", [1, 2, 3], max_new=20)
    plan = s.schedule()
    assert plan.work[0].token_ids == (1, 2, 3)
    s.commit(plan, StepOutput((Sampled("a", 9, None),)))


def test_rejected_drafts_give_their_chunks_back():
    s = scheduler()
    prefill(s)
    conv = s.seqs["a"].conv
    assert conv.table.chunk_ids == [0] and conv.num_cells == 3
    s.seqs["a"].spec = LaneSpec(AdaptiveK(3, alpha=0.9))  # a lane that keeps most drafts: k = its max, 3
    plan = s.schedule()
    (w,) = plan.work
    assert w.token_ids == (9, 50, 51, 52) and w.num_drafts == 3
    assert conv.table.chunk_ids == [0, 1]  # room for cells 3..6
    out = StepOutput((Sampled("a", 50, None), Sampled("a", 60, None)), (DraftOutcome("a", 3, 1),))
    s.commit(plan, out)
    assert conv.num_cells == 5 and conv.token_ids == [1, 2, 3, 9, 50]  # the fed token and one kept draft
    assert conv.table.chunk_ids == [0, 1] and s.seqs["a"].pending == 60
    plan = s.schedule()
    out = StepOutput((Sampled("a", 70, None),), (DraftOutcome("a", plan.work[0].num_drafts, 0),))
    s.commit(plan, out)
    assert conv.num_cells == 6 and conv.table.chunk_ids == [0, 1]
    check_scheduler(s)


def test_all_rejected_at_a_chunk_border_frees_the_chunk():
    s = scheduler()
    prefill(s)
    s.drafts.drafter = FixedDrafter([50, 51, 52, 53, 54])
    conv = s.seqs["a"].conv
    plan = s.schedule()  # cells 3..6: chunk 1 taken for the drafts
    assert conv.table.chunk_ids == [0, 1]
    s.commit(plan, StepOutput((Sampled("a", 60, None),), (DraftOutcome("a", plan.work[0].num_drafts, 0),)))
    assert conv.num_cells == 4 and conv.table.chunk_ids == [0]  # chunk 1 held only rejected cells
    assert s.layout.pool.num_free == 5
    check_scheduler(s)


def test_drafts_take_only_free_chunks():
    s = scheduler(num_chunks=1)  # 4 cells: the prompt and one decoded token fill it
    prefill(s)
    plan = s.schedule()
    assert plan.work[0].token_ids == (9,) and plan.work[0].num_drafts == 0  # no room: no drafts
    s.commit(plan, StepOutput((Sampled("a", 60, None),)))
    check_scheduler(s)


def test_drafts_stop_short_of_max_tokens():
    layout = PooledLayout(6, 4)
    s = Scheduler(layout, num_lanes=1, max_context=64, prefill_chunk=16, drafts=NgramPlanner(4, layout, 64))
    s.drafts.drafter = FixedDrafter([50, 51, 52, 53])
    s.add("a", [1, 2, 3], max_new=3)  # target 6 cells: tokens at 3 (fed), 4 and a last one of its own
    plan = s.schedule()
    s.commit(plan, StepOutput((Sampled("a", 9, None),)))
    plan = s.schedule()
    assert plan.work[0].token_ids == (9, 50)
