"""The resident ring's page copies in one extension call (csrc/copy_cells.cpp) against torch's
copy per part and run (cells/ring_step.py `_copy`): any runs, dtypes and cell shapes, int8
cells' scales beside their values, the threaded path for large copies, and every bound
checked before a byte moves. On the engine: the ring copies through it on the fused path and
gives the tokens and arena it gives with torch's copies."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.cells.dense import DenseCells
from strata.cells.ring_step import _copy
from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.sampling import SamplingParams
from tests.conftest import FUSED_ONLY
from tests.model.engine_runs import run_requests


@pytest.fixture(scope="module", params=FUSED_ONLY)
def ops(request):
    return request.getfixturevalue("decode_ops")


class Parts:
    """Cells-like: just `parts` (what `_copy` reads)."""

    def __init__(self, *parts: torch.Tensor):
        self.parts = parts


def make_parts(kind: str, heads: int, cells: int, dim: int, seed: int) -> Parts:
    g = torch.Generator().manual_seed(seed)
    if kind == "int8":
        return Parts(torch.randint(-128, 128, (heads, cells, dim), dtype=torch.int8, generator=g),
                     torch.rand(heads, cells, generator=g).to(torch.bfloat16))
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[kind]
    return Parts(torch.randn(heads, cells, dim, generator=g).to(dtype))


@st.composite
def copies(draw):
    """(kind, heads, dim, src cells, dst cells, runs) with runs' destinations disjoint, as the
    ring's are (each staging or arena cell is written once a step)."""
    kind = draw(st.sampled_from(["bf16", "f32", "int8"]))
    heads, dim = draw(st.integers(1, 4)), draw(st.sampled_from([1, 8, 64]))
    src_cells, dst_cells = draw(st.integers(1, 80)), draw(st.integers(1, 80))
    cuts = sorted(draw(st.lists(st.integers(0, dst_cells), min_size=0, max_size=8)))
    runs = []
    for a, b in zip(cuts[::2], cuts[1::2]):
        n = min(b - a, src_cells)
        runs.append((draw(st.integers(0, src_cells - n)), a, n))
    return kind, heads, dim, src_cells, dst_cells, runs


@settings(max_examples=80, deadline=None)
@given(case=copies(), seed=st.integers(0, 2**16))
def test_one_call_copies_what_torch_copies(ops, case, seed):
    kind, heads, dim, src_cells, dst_cells, runs = case
    src = make_parts(kind, heads, src_cells, dim, seed)
    want = make_parts(kind, heads, dst_cells, dim, seed + 1)
    got = Parts(*(t.clone() for t in want.parts))
    _copy(want, src, runs, non_blocking=False)
    ops.copy_cells(list(got.parts), list(src.parts), torch.tensor(runs, dtype=torch.long).view(-1, 3))
    for g, w in zip(got.parts, want.parts):
        assert torch.equal(g, w)


def test_a_large_copy_split_across_threads_copies_every_byte(ops):
    """Over 1 MiB in all: the copy is split across torch's threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        src, dst = make_parts("bf16", 3, 8192, 64, 1), make_parts("bf16", 3, 6144, 64, 2)
        runs = [(0, 0, 2048), (4096, 2048, 3000), (8000, 5048, 192), (7000, 5240, 904)]
        want = Parts(dst.parts[0].clone())
        _copy(want, src, runs, non_blocking=False)
        ops.copy_cells(list(dst.parts), list(src.parts), torch.tensor(runs))
        assert torch.equal(dst.parts[0], want.parts[0])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("runs, message", [
    ([(0, 0, 4), (30, 0, 4)], r"run 1 \(30, 0, 4\) is outside pair 0"),
    ([(0, 14, 4)], r"run 0 \(0, 14, 4\) is outside pair 0"),
    ([(-1, 0, 2)], "outside pair 0"),
])
def test_a_run_out_of_bounds_moves_nothing(ops, runs, message):
    src, dst = make_parts("bf16", 2, 32, 8, 1), make_parts("bf16", 2, 16, 8, 2)
    before = dst.parts[0].clone()
    with pytest.raises(RuntimeError, match=message):
        ops.copy_cells(list(dst.parts), list(src.parts), torch.tensor(runs))
    assert torch.equal(dst.parts[0], before)


def test_mismatched_or_strided_tensors_are_refused(ops):
    runs = torch.tensor([(0, 0, 2)])
    bf, f32 = make_parts("bf16", 2, 8, 8, 1).parts[0], make_parts("f32", 2, 8, 8, 1).parts[0]
    with pytest.raises(RuntimeError, match="differs in dtype"):
        ops.copy_cells([bf], [f32], runs)
    with pytest.raises(RuntimeError, match="differs in shape beyond its cells"):
        ops.copy_cells([bf], [torch.zeros(2, 8, 4, dtype=torch.bfloat16)], runs)
    with pytest.raises(RuntimeError, match="contiguous from dim 1 on"):
        ops.copy_cells([bf], [torch.zeros(2, 8, 8, dtype=torch.bfloat16).transpose(1, 2)], runs)
    with pytest.raises(RuntimeError, match=r"\[R, 3\] int64"):
        ops.copy_cells([bf], [bf.clone()], torch.tensor([0, 0, 2]))
    with pytest.raises(RuntimeError, match="as many destinations as sources"):
        ops.copy_cells([bf], [], runs)


def test_dense_cells_parts_are_what_it_copies(ops):
    """The pool's and the ring's cells (DenseCells) meet the op's layout."""
    src, dst = DenseCells.zeros(3, 32, 16, torch.bfloat16, torch.device("cpu")), DenseCells.zeros(
        3, 16, 16, torch.bfloat16, torch.device("cpu"))
    src.data.copy_(torch.randn(3, 32, 16))
    ops.copy_cells(list(dst.parts), list(src.parts), torch.tensor([(5, 2, 9)]))
    assert torch.equal(dst.data[:, 2:11], src.data[:, 5:14])


def ring_engine(tiny_llama_dir: str, kv: str) -> Engine:
    """A ring of two 16-cell pages under prompts of ~60 cells: most pages stream every step."""
    return Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", max_context=160, kv_chunk=16, batch=2,
                               prefill_chunk=13, kv=kv, kv_resident=32, kv_page=16, kv_ring_adapt=False),
                  progress=False)


@pytest.mark.parametrize("kv", ["f32", "int8"])
def test_the_ring_copies_in_one_call_as_torch_copies(ops, tiny_llama_dir, kv):
    prompts = [list(range(100, 160)), list(range(300, 345))]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    one_call, per_run = ring_engine(tiny_llama_dir, kv), ring_engine(tiny_llama_dir, kv)
    calls = []
    for ring in one_call._ring.rings:
        assert ring.copy_cells is ops.copy_cells
        ring.copy_cells = lambda *a, _f=ops.copy_cells: calls.append(1) or _f(*a)
    for ring in per_run._ring.rings:
        ring.copy_cells = None
    assert run_requests(one_call, prompts, params) == run_requests(per_run, prompts, params)
    assert calls, "the ring streamed pages through the one-call copy"
    a, b = one_call._ring.full, per_run._ring.full
    for i in a.layers:
        for x, y in zip((*a.arena_k[i].parts, *a.arena_v[i].parts), (*b.arena_k[i].parts, *b.arena_v[i].parts)):
            assert torch.equal(x, y)
