"""Every way attention reads a lane's cells, against a naive reference written here.

The engine reads a lane's K/V in place when its cells are contiguous, several lanes through
one strided view when they sit evenly spaced (the reserved layout), a long lane in a few
runs of chunks run by run (merged by log-sum-exp), and through a gather of flat cells
otherwise; prefill pieces read the same ways under a causal mask aligned to their last
cell. Each test below drives the real code (`build_inputs`, then `attend` on one layer of
a `KVStorage` filled with random values), checks that the read path it is about was the
one taken (so a path that silently fell back to another would be noticed), and compares
every output row with the reference: for each lane, its cells found by walking its chunk
table position by position, and plain softmax(q k^T * scale) v over the positions up to
the row's own, in float64, query head h reading K/V head h // (heads // kv_heads).
With int8 K/V (`--kv int8`) the reference quantises the new K/V and dequantises every cell
with its own code (symmetric int8 per (head, cell), float16 scale = absmax / 127).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from strata.step import LaneWork
from strata.cells.int8 import Int8Cells
from strata.cells.storage import KVStorage
from strata.models.attention import AttentionMeta, attend
from strata.runner.inputs import VERIFY_MAX_ROWS, build_inputs
from strata.runner.reads import MAX_RUNS, ChunkCells

ATOL = RTOL = 1e-5  # float32 compute against a float64 reference
LAYER = 1  # of two: the test reads a layer other than the first
CPU = torch.device("cpu")
FAST = settings(max_examples=60, deadline=None)


@dataclass(frozen=True)
class Lane:
    chunk_ids: tuple[int, ...]  # the table; may cover more chunks than the lane has reached
    start: int  # cells already written before this step
    num_new: int  # 1: a decoding lane; more: a prefill piece

    @property
    def num_cells(self) -> int:
        return self.start + self.num_new


@dataclass(frozen=True)
class Shape:
    chunk_size: int
    num_chunks: int  # in the storage
    kv_heads: int
    group: int  # query heads per K/V head
    head_dim: int
    kv_dtype: str  # the storage's

    @property
    def heads(self) -> int:
        return self.kv_heads * self.group


# --- the reference --------------------------------------------------------------------


def ref_quantise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., dim] -> (integers in [-127, 127] as float32, float16 scale [...]): symmetric per row."""
    scale = (x.float().abs().amax(-1) / 127).half()
    divisor = torch.where(scale > 0, scale.float(), torch.ones_like(scale, dtype=torch.float32))
    return torch.clamp(torch.round(x.float() / divisor.unsqueeze(-1)), -127, 127), scale


def ref_dequantise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.double() * scale.double().unsqueeze(-1)


def stored(x: torch.Tensor, kv_dtype: str) -> torch.Tensor:
    """What reading back `x` [..., dim] after storing it as `kv_dtype` gives, in float64."""
    if kv_dtype == "int8":
        return ref_dequantise(*ref_quantise(x))
    return x.to(KV_DTYPES[kv_dtype]).double()


KV_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def cell_of(chunk_ids: tuple[int, ...], p: int, chunk_size: int) -> int:
    """Position p of a conversation -> its flat cell: chunk chunk_ids[p // c], cell p % c."""
    return chunk_ids[p // chunk_size] * chunk_size + p % chunk_size


def reference(shape: Shape, k0: torch.Tensor, v0: torch.Tensor, lanes: list[Lane],
              q: list[torch.Tensor], k: list[torch.Tensor], v: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per lane [num_new, heads, head_dim] in float64; k0, v0: the layer before the step."""
    c = shape.chunk_size
    k_cells, v_cells = k0.double(), v0.double()  # as stored: new K/V rounds (or is quantised) as it is stored
    for lane, kl, vl in zip(lanes, k, v):
        for i in range(lane.num_new):
            cell = cell_of(lane.chunk_ids, lane.start + i, c)
            k_cells[:, cell] = stored(kl[i], shape.kv_dtype)
            v_cells[:, cell] = stored(vl[i], shape.kv_dtype)
    kv_head = torch.tensor([h // shape.group for h in range(shape.heads)])  # query head -> its K/V head
    outs = []
    for lane, ql in zip(lanes, q):
        cells = [cell_of(lane.chunk_ids, p, c) for p in range(lane.num_cells)]
        keys = k_cells[:, cells].double()[kv_head]  # [heads, cells, dim]
        values = v_cells[:, cells].double()[kv_head]
        scores = torch.einsum("nhd,hpd->nhp", ql.double(), keys) / math.sqrt(shape.head_dim)
        positions = torch.arange(lane.start, lane.num_cells).view(-1, 1, 1)  # each new row's own position
        scores = scores.masked_fill(torch.arange(lane.num_cells) > positions, float("-inf"))
        outs.append(torch.einsum("nhp,hpd->nhd", torch.softmax(scores, dim=-1), values))
    return outs


# --- the engine -----------------------------------------------------------------------


def read_paths(meta: AttentionMeta, work: tuple[LaneWork, ...]) -> dict[int, str]:
    """Lane -> how its cells were read this step, as the step's addressing says."""
    lane_at, row = {}, 0  # first row -> lane
    for w in work:
        lane_at[row] = w.lane
        row += len(w.token_ids)
    paths = {}
    for d in meta.decode:  # one row per lane
        for r in range(d.row_start, d.row_start + d.num_rows):
            paths[lane_at[r]] = d.kind
    for p in meta.prefills:
        paths[lane_at[p.row_start]] = p.kind
    assert sorted(paths) == sorted(lane_at.values())
    return paths


def check(shape: Shape, lanes: list[Lane], seed: int, *, known_storage: bool = True,
          runs_min_cells: int = 1024) -> dict[int, str]:
    """One step of `lanes` through the engine and through the reference; returns each lane's
    read path. Lane i is LaneWork lane i."""
    c = shape.chunk_size
    for lane in lanes:
        assert len(lane.chunk_ids) * c >= lane.num_cells
    held = [cell_of(lane.chunk_ids, p, c) for lane in lanes for p in range(lane.num_cells)]
    assert len(set(held)) == len(held) and max(held) < shape.num_chunks * c, "lanes must not share cells"
    g = torch.Generator().manual_seed(seed)
    storage = KVStorage(shape.num_chunks, c, shape.kv_heads, shape.head_dim, shape.kv_dtype, [CPU, CPU])
    every = torch.arange(shape.num_chunks * c)
    for t in (*storage.k, *storage.v):
        x = torch.randn(t.shape, generator=g) * (1 + 3 * torch.rand(t.shape[:2] + (1,), generator=g))
        if isinstance(t, Int8Cells):  # cells of varied magnitude, some all zero
            x[:, torch.rand(x.shape[1], generator=g) < 0.1] = 0
            t.write(every, x)
        else:
            t.data.copy_(x)
    if shape.kv_dtype == "int8":  # the cells before the step, read back with the test's own code
        k0, v0 = (ref_dequantise(t.data.float(), t.scale) for t in (storage.k[LAYER], storage.v[LAYER]))
    else:
        k0, v0 = storage.k[LAYER].data.double(), storage.v[LAYER].data.double()
    q = [torch.randn(lane.num_new, shape.heads, shape.head_dim, generator=g) for lane in lanes]
    k = [torch.randn(lane.num_new, shape.kv_heads, shape.head_dim, generator=g) for lane in lanes]
    v = [torch.randn(lane.num_new, shape.kv_heads, shape.head_dim, generator=g) for lane in lanes]

    work = [LaneWork(i, f"r{i}", tuple(range(100, 100 + lane.num_new)), lane.start, lane.chunk_ids, True)
            for i, lane in enumerate(lanes)]
    cells = ChunkCells(c, shape.num_chunks * c if known_storage else None, runs_min_cells=runs_min_cells)
    inp = build_inputs(work, cells)
    order = [w.lane for w in inp.work]
    assert sorted(order) == list(range(len(lanes)))
    out = attend(torch.cat([q[i] for i in order]), torch.cat([k[i] for i in order]),
                 torch.cat([v[i] for i in order]), storage.k[LAYER], storage.v[LAYER], inp.meta)
    out = out.view(-1, shape.heads, shape.head_dim)
    want = reference(shape, k0, v0, lanes, q, k, v)
    row = 0
    for i in order:
        got = out[row : row + lanes[i].num_new]
        row += lanes[i].num_new
        torch.testing.assert_close(got.double(), want[i], atol=ATOL, rtol=RTOL,
                                   msg=lambda m, i=i: f"lane {i} ({lanes[i]}): {m}")
    assert row == out.shape[0]
    return read_paths(inp.meta, inp.work)


# --- strategies -----------------------------------------------------------------------


@st.composite
def shapes(draw, chunk_size=st.integers(1, 8)) -> dict:
    return dict(chunk_size=draw(chunk_size), kv_heads=draw(st.integers(1, 3)), group=draw(st.integers(1, 3)),
                head_dim=draw(st.sampled_from([4, 8, 16])), kv_dtype=draw(st.sampled_from(["f32", "bf16", "f16", "int8"])))


def chunks_for(num_cells: int, c: int) -> int:
    return -(-num_cells // c)


@st.composite
def new_tokens(draw, num_cells: int, prefill: bool | None = None) -> int:
    """How many of a lane's `num_cells` cells are new this step: 1 (decode) or a prefill piece."""
    if prefill is None:
        prefill = num_cells > 1 and draw(st.booleans())
    return draw(st.integers(2, num_cells)) if prefill else 1


@st.composite
def in_runs(draw, c: int, min_runs: int = 2, max_runs: int = MAX_RUNS):
    """A long lane whose chunks form `runs` contiguous runs, never adjacent in storage."""
    lengths = draw(st.lists(st.integers(1, 3), min_size=min_runs, max_size=max_runs))  # chunks per run
    num_cells = draw(st.integers((sum(lengths) - 1) * c + 1, sum(lengths) * c))  # every chunk reached
    placed = draw(st.permutations(range(len(lengths))))  # the runs' order in storage
    gaps = draw(st.lists(st.integers(1, 2), min_size=len(lengths), max_size=len(lengths)))
    first, at = {}, draw(st.integers(0, 2))
    for r, gap in zip(placed, gaps):
        first[r] = at
        at += lengths[r] + gap
    table = tuple(first[r] + i for r in range(len(lengths)) for i in range(lengths[r]))
    return table, num_cells, len(lengths), at


# --- one path at a time ---------------------------------------------------------------



def contiguous_prefill(rows: int, num_cells: int) -> str:
    """A contiguous lane's prefill piece: a few rows over a longer lane (a verify step's) run by
    run, the cells every row sees apart from the last few (runner/inputs.py VERIFY_MAX_ROWS)."""
    return "prefill-runs" if rows <= VERIFY_MAX_ROWS < num_cells else "prefill-contiguous"

@FAST
@given(shape=shapes(), data=st.data(), seed=st.integers(0, 2**16))
def test_one_contiguous_lane_is_read_in_place(shape, data, seed):
    c = shape["chunk_size"]
    num_cells = data.draw(st.integers(1, 40))
    first = data.draw(st.integers(0, 3))
    extra = data.draw(st.integers(0, 2))  # chunks grown into but not yet written
    lane = Lane(tuple(range(first, first + chunks_for(num_cells, c) + extra)), 0, 0)
    lane = Lane(lane.chunk_ids, num_cells - (n := data.draw(new_tokens(num_cells))), n)
    s = Shape(num_chunks=first + len(lane.chunk_ids) + 1, **shape)
    paths = check(s, [lane], seed, known_storage=data.draw(st.booleans()), runs_min_cells=1)
    assert paths == {0: "contiguous" if n == 1 else contiguous_prefill(n, num_cells)}


@FAST
@given(shape=shapes(), data=st.data(), seed=st.integers(0, 2**16))
def test_evenly_spaced_lanes_are_read_through_one_strided_view(shape, data, seed):
    """The reserved layout: lane slot s owns chunks [s * per_lane, (s + 1) * per_lane); the
    decoding lanes (within 2x of each other's length: one group) sit in some of the slots,
    with room for as many empty slots between them as there are lanes."""
    c = shape["chunk_size"]
    per_lane = data.draw(st.integers(1, 4))
    num_rows = data.draw(st.integers(2, 4))
    slots = sorted(data.draw(st.lists(st.integers(0, 2 * num_rows - 1), min_size=num_rows, max_size=num_rows,
                                      unique=True)))
    shortest = data.draw(st.integers(1, max(1, per_lane * c // 2)))
    lengths = [shortest] + [data.draw(st.integers(shortest, min(2 * shortest, per_lane * c)))
                            for _ in slots[1:]]
    lengths = data.draw(st.permutations(lengths))
    lanes = [Lane(tuple(range(s * per_lane, (s + 1) * per_lane)), n - 1, 1) for s, n in zip(slots, lengths)]
    s = Shape(num_chunks=2 * num_rows * per_lane, **shape)
    paths = check(s, lanes, seed, runs_min_cells=data.draw(st.integers(1, 64)))
    assert set(paths.values()) == {"strided"}, paths


@FAST
@given(shape=shapes(), data=st.data(), seed=st.integers(0, 2**16))
def test_a_long_lane_in_a_few_runs_is_read_run_by_run(shape, data, seed):
    c = shape["chunk_size"]
    table, num_cells, num_runs, end = data.draw(in_runs(c))
    n = data.draw(new_tokens(num_cells))
    lanes = [Lane(table, num_cells - n, n)]
    # other lanes after the long one's chunks, read however they are
    at = end
    for _ in range(data.draw(st.integers(0, 2))):
        m = data.draw(st.integers(1, 12))
        k = data.draw(new_tokens(m))
        lanes.append(Lane(tuple(range(at, at + chunks_for(m, c))), m - k, k))
        at += chunks_for(m, c)
    s = Shape(num_chunks=at, **shape)
    paths = check(s, lanes, seed, runs_min_cells=data.draw(st.integers(1, num_cells)))
    assert paths[0] == ("runs" if n == 1 else "prefill-runs"), paths


@FAST
@given(shape=shapes(), data=st.data(), seed=st.integers(0, 2**16))
def test_scattered_lanes_are_gathered(shape, data, seed):
    """Tables whose chunks are in no useful order (permuted, interleaved between lanes): every
    lane is gathered, decoding lanes padded to their group's longest."""
    c = shape["chunk_size"]
    lengths = data.draw(st.lists(st.integers(c + 1, 30 + c), min_size=1, max_size=4))  # 2+ chunks each
    news = [data.draw(new_tokens(m)) for m in lengths]
    need = [chunks_for(m, c) for m in lengths]
    order = data.draw(st.permutations(range(sum(need) + data.draw(st.integers(0, 3)))))
    if data.draw(st.booleans()):  # interleaved: lanes take turns, as pool lanes growing together do
        owner = [lane for j in range(max(need)) for lane in range(len(need)) if j < need[lane]]
    else:  # each lane's chunks together in the permutation
        owner = [lane for lane in range(len(need)) for _ in range(need[lane])]
    tables = [[] for _ in lengths]
    for lane, chunk in zip(owner, order):
        tables[lane].append(chunk)
    for t in tables:  # force a break in each table: no lane is one run
        if t[1] == t[0] + 1:
            t[0], t[1] = t[1], t[0]
    lanes = [Lane(tuple(t), m - k, k) for t, m, k in zip(tables, lengths, news)]
    s = Shape(num_chunks=len(order), **shape)
    # Storage size unknown (as on accelerators), or runs too short to be read run by run.
    known = data.draw(st.booleans())
    paths = check(s, lanes, seed, known_storage=known, runs_min_cells=1024)
    for i, lane in enumerate(lanes):
        assert paths[i] == ("gathered" if lane.num_new == 1 else "prefill-gathered"), (i, paths)


@FAST
@given(shape=shapes(), data=st.data(), seed=st.integers(0, 2**16))
def test_prefill_pieces_attend_causally_from_any_start(shape, data, seed):
    """Several lanes prefilling at once: from position 0 (plain causal), or a piece that starts
    mid-conversation (causal, aligned to the last cell), each in one run of chunks or not."""
    c = shape["chunk_size"]
    lanes, at = [], 0
    expect = {}
    for i in range(data.draw(st.integers(1, 3))):
        num_cells = data.draw(st.integers(2, 30))
        n = data.draw(st.integers(2, num_cells))
        need = chunks_for(num_cells, c)
        table = list(range(at, at + need))
        if need > 1 and data.draw(st.booleans()):
            table = data.draw(st.permutations(table))
        at += need
        lanes.append(Lane(tuple(table), num_cells - n, n))
        expect[i] = contiguous_prefill(n, num_cells) if table == sorted(table) else "prefill-gathered"
    s = Shape(num_chunks=at, **shape)
    assert check(s, lanes, seed, runs_min_cells=1024) == expect


# --- everything at once ---------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(shape=shapes(), data=st.data(), seed=st.integers(0, 2**16))
def test_any_step_matches_the_reference(shape, data, seed):
    """Mixed steps: decoding lanes and prefill pieces of any lengths, tables laid out in
    order, interleaved, permuted or in runs, storage size known or not, any run threshold."""
    c = shape["chunk_size"]
    lengths = data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=5))
    news = [data.draw(new_tokens(m)) for m in lengths]
    need = [chunks_for(m, c) + data.draw(st.integers(0, 1)) for m in lengths]
    total = sum(need) + data.draw(st.integers(0, 4))
    layout = data.draw(st.sampled_from(["in order", "interleaved", "permuted", "blocks"]))
    if layout == "interleaved":
        owner = [lane for j in range(max(need)) for lane in range(len(need)) if j < need[lane]]
    else:
        owner = [lane for lane in range(len(need)) for _ in range(need[lane])]
    chunks = list(range(total))
    if layout == "permuted":
        chunks = data.draw(st.permutations(chunks))
    elif layout == "blocks":  # storage cut in blocks, shuffled: lanes in a few runs
        cuts = sorted(data.draw(st.sets(st.integers(1, max(1, total - 1)), max_size=6)))
        blocks = [chunks[a:b] for a, b in zip([0, *cuts], [*cuts, total]) if a < b]
        chunks = [x for b in data.draw(st.permutations(blocks)) for x in b]
    tables = [[] for _ in lengths]
    for lane, chunk in zip(owner, chunks):
        tables[lane].append(chunk)
    lanes = [Lane(tuple(t), m - k, k) for t, m, k in zip(tables, lengths, news)]
    s = Shape(num_chunks=total, **shape)
    paths = check(s, lanes, seed, known_storage=data.draw(st.booleans()),
                  runs_min_cells=data.draw(st.sampled_from([1, 4, 16, 1024])))
    assert "?" not in paths.values()
    for path in set(paths.values()):  # pytest --hypothesis-show-statistics: how often each path ran
        event(path)

