"""Session files of layer groups (docs/sessions.md, format version 2) give the keep-everything tokens.

Tiny random Gemma 3 and Mistral-style models, float32, windows of 8 to 64, chunks of 4 to 64
(the fixtures of test_window_group_layouts.py): a conversation that grew past its windows is
saved from the pooled layout whose windowed groups hold only their windows, restored, and
continued; the follow-up and a branch from the turn start its file kept the window of equal
the tokens of the reserved layout, which keeps every cell of every layer and recomputes from
scratch. The file's windowed records hold exactly the cells of the chunks the conversation
held in each group; a keep-everything file (version 1) restores into the groups; a file whose
groups do not match is refused before any room is taken, and a damaged one leaves every
group's pool as it was.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.errors import SessionFileError
from strata.kv.session_format import CRC, PREFIX, crc32, read_header
from tests.checks import check_scheduler
from tests.model.test_window_group_layouts import (  # noqa: F401 - fixtures
    engines, geometry, keep_everything, model_dirs, run, tokens_st,
)

words = st.lists(st.integers(3, 40000), min_size=1, max_size=24)


def pools_state(engine) -> list:
    """Every group's pool (free ids, refcounts) and every conversation's tables in every group."""
    layout, cache = engine._layout, engine._scheduler.cache
    pools = [(p.free_ids(), [p.refcount(i) for i in range(p.num_total)]) for p in (layout.pool, *layout.window_pools)]
    convs = sorted((c.conv_id, tuple(c.token_ids), tuple(c.table.chunk_ids),
                    tuple((tuple(w.chunk_ids), tuple(w.kept)) for w in c.table.windows)) for c in cache)
    return [pools, convs, len(engine._sessions._flights)]


def windowed_cells(conv, n: int) -> list[int]:
    """Per windowed group: the cells of the chunks the conversation holds there, cut at n."""
    c = conv.table.windows[0].pool.chunk_size
    return [sum(min((j + 1) * c, n) - j * c for j, i in enumerate(w.chunk_ids) if i is not None)
            for w in conv.table.windows]


def rewrite(data: bytes, old: bytes, new: bytes) -> bytes:
    """The header edited and its CRC made right again, so only the edit is wrong."""
    _, version, length = PREFIX.unpack(data[: PREFIX.size])
    body = data[PREFIX.size : PREFIX.size + length]
    assert old in body
    body = body.replace(old, new)
    head = data[:8] + struct.pack("<II", version, len(body)) + body
    return head + CRC.pack(crc32(head)) + data[PREFIX.size + length + CRC.size :]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(geo=geometry, first=tokens_st, follow=words, more=words, branch=words)
def test_round_trips_equal_keep_everything(engines, tmp_path_factory, geo, first, follow, more, branch):
    arch, window, chunk = geo
    d = tmp_path_factory.mktemp("sessions")
    engine = engines(*geo, True)
    engine._scheduler.clear_cache()
    (out1,) = run(engine, [first])
    second = first + out1 + follow
    turn2 = len(first) + len(out1) - 1  # the second turn's start: a checkpoint whose window is kept
    (out2,) = run(engine, [second])
    history = second + out2[:-1]  # the last token was never fed: it has no K/V
    n = len(history)
    conv = next(c for c in engine._scheduler.cache if c.token_ids == history)

    grouped = str(d / "groups.strata")
    saved = engine.save_session(grouped, token_ids=history)
    with open(grouped, "rb") as f:
        header, header_bytes = read_header(f, grouped)
    assert header.version == 2 and header.windows_kept == [p for p in conv.table.windows[0].kept if p < n]
    assert turn2 in header.windows_kept
    # the windowed records hold exactly the cells of the chunks the conversation held there
    assert [g.num_cells for g in header.groups[1:]] == windowed_cells(conv, n)
    g = engine._kv.layer_bytes_per_cell
    full_layers = len(header.groups[0].layers)
    kv = (n * full_layers + sum(len(x.layers) * x.num_cells for x in header.groups[1:])) * g
    assert saved.num_bytes == header_bytes + kv + header.num_records * CRC.size
    ref = engines(arch, window, 64, False)  # keeps every cell: its file is version 1
    ref._scheduler.clear_cache()
    assert run(ref, [first]) == [out1] and run(ref, [second]) == [out2]  # two turns: checkpoints 0 and turn2
    every = str(d / "every.strata")
    whole = ref.save_session(every, token_ids=history)
    v1 = read_header(open(every, "rb"), every)[0]
    assert v1.version == 1 and v1.checkpoints == [0, turn2]
    assert whole.num_bytes == len(v1.encode()) + n * engine._kv.num_layers * g + -(-n // 64) * CRC.size
    assert kv <= n * engine._kv.num_layers * g
    if n > 4 * (window + 2 * chunk):  # past its windows (three kept and the last) the grouped file holds less
        assert kv < n * engine._kv.num_layers * g

    # restore and go on: the follow-up, then a branch from the second turn's start
    third = history + out2[-1:] + more
    if branch[0] == history[turn2]:
        branch[0] = 3 if history[turn2] != 3 else 4  # the branch leaves the history at turn2
    fourth = history[:turn2] + branch
    want = keep_everything(engines, arch, window, [third, fourth])
    for path in (grouped, every):  # a version 1 file restores into the groups too
        engine._scheduler.clear_cache()
        restored = engine.restore_session(path)
        check_scheduler(engine._scheduler)
        cached = engine._scheduler.counters.num_cached_tokens
        assert run(engine, [third]) == want[:1]
        assert engine._scheduler.counters.num_cached_tokens - cached == n  # every restored cell reused
        cached = engine._scheduler.counters.num_cached_tokens
        assert run(engine, [fourth]) == want[1:]
        assert engine._scheduler.counters.num_cached_tokens - cached == min(turn2, len(fourth) - 1)
        assert restored.num_cells == n


@pytest.fixture(scope="module")
def grouped_file(engines, tmp_path_factory):
    """A Gemma 3 conversation of 150 cells saved with groups (window 20, chunks of 16)."""
    engine = engines("gemma3_text", 20, 16, True)
    engine._scheduler.clear_cache()
    prompt = list(range(1000, 1140))
    (out,) = run(engine, [prompt])
    path = str(tmp_path_factory.mktemp("groups") / "g.strata")
    engine.save_session(path, token_ids=prompt + out[:-1])
    return path


def test_mismatched_groups_are_refused_before_any_room_is_taken(engines, grouped_file, tmp_path):
    data = open(grouped_file, "rb").read()
    other = tmp_path / "other-window.strata"
    other.write_bytes(rewrite(data, b'"window":20', b'"window":21'))
    engine = engines("gemma3_text", 20, 16, True)
    run(engine, [list(range(300, 340))])
    reserved = engines("gemma3_text", 20, 64, False)  # one group: every cell of every layer
    run(reserved, [list(range(300, 340))])
    for e, path, why in [(engine, str(other), "layer groups .*window 21.* do not match this engine's .*window 20"),
                         (reserved, grouped_file, "holds sliding-window layer groups .* keeps every cell")]:
        before = pools_state(e)
        with pytest.raises(SessionFileError, match=why) as err:
            e.restore_session(path)
        assert err.value.code == "session_mismatch" and pools_state(e) == before


def test_a_damaged_file_leaves_every_group_as_it_was(engines, grouped_file, tmp_path):
    data = bytearray(open(grouped_file, "rb").read())
    data[-40] ^= 0x20  # in the last windowed record: found after the others were written
    bad = tmp_path / "bad.strata"
    bad.write_bytes(bytes(data))
    engine = engines("gemma3_text", 20, 16, True)
    engine._scheduler.clear_cache()
    run(engine, [list(range(300, 340))])
    run(engine, [list(range(500, 560))])
    before = pools_state(engine)
    with pytest.raises(SessionFileError, match="checksum mismatch"):
        engine.restore_session(str(bad))
    assert pools_state(engine) == before
    check_scheduler(engine._scheduler)
    engine.restore_session(grouped_file)  # the control: the good file is taken
    assert pools_state(engine) != before
    check_scheduler(engine._scheduler)


def test_a_save_in_flight_holds_every_group_while_the_conversation_passes_its_windows(engines, tmp_path):
    """The save's snapshot shares the windowed chunks: the follow-up meanwhile passes several
    windows (its chunks behind them go back but the save's stay) and the file equals an idle save."""
    from tests.model.test_session_inflight import Gate

    engine = engines("gemma3_text", 8, 4, True)
    engine._scheduler.clear_cache()
    prompt = list(range(700, 760))
    (out,) = run(engine, [prompt])
    history = prompt + out[:-1]
    idle = tmp_path / "idle.strata"
    engine.save_session(str(idle), token_ids=history)
    gate = Gate(at=1)
    job = engine.begin_save_session(str(tmp_path / "held.strata"), token_ids=history, on_record=gate)
    assert gate.reached.wait(60)
    (more,) = run(engine, [history + out[-1:] + list(range(900, 930))])  # 40 cells: five windows on
    assert not job.done
    gate.release.set()
    engine._sessions.wait(job)
    check_scheduler(engine._scheduler)
    assert (tmp_path / "held.strata").read_bytes() == idle.read_bytes()
    assert more == keep_everything(engines, "gemma3_text", 8, [history + out[-1:] + list(range(900, 930))])[0]


def test_a_restore_short_of_windowed_room_verifies_first_and_its_oldest_kept_windows_give_way(engines, tmp_path):
    """The windowed pool is short of the file's kept windows: other conversations' kept windows
    give way, then the file's own, oldest first, before any conversation (the checksums are
    verified before anything changes), and the conversation goes on with the keep-everything tokens."""
    from strata.kv.window_table import num_to_hold

    engine = engines("gemma3_text", 8, 4, True)
    engine._scheduler.clear_cache()
    turns = [list(range(100 + 40 * i, 120 + 40 * i)) for i in range(4)]
    history: list[int] = []
    for turn in turns:  # four turns: each keeps the windows before its start and its prompt's end
        (out,) = run(engine, [history + turn])
        history = history + turn + out[:-1]
        last = out[-1]
    path = str(tmp_path / "turns.strata")
    engine.save_session(path, token_ids=history)
    header = read_header(open(path, "rb"), path)[0]
    assert len(header.windows_kept) >= 6
    engine._scheduler.clear_cache()
    for i in range(5):  # idle conversations holding windows and kept windows
        run(engine, [list(range(3000 + 100 * i, 3060 + 100 * i))])
    pool, held = engine._layout.window_pools[0], len(engine._scheduler.cache)
    assert num_to_hold(8, 4, len(history), header.windows_kept) > pool.num_free  # short: something gives way
    restored = engine.restore_session(path)
    check_scheduler(engine._scheduler)
    assert restored.verified_first
    kept = engine._scheduler.cache.get(restored.conv_id).table.windows[0].kept
    assert 0 < len(kept) < len(header.windows_kept)
    assert kept == header.windows_kept[len(header.windows_kept) - len(kept):]  # the newest stayed
    assert len(engine._scheduler.cache) == held + 1  # kept windows gave way before any conversation
    follow = history + [last, 5000, 5001]
    cached = engine._scheduler.counters.num_cached_tokens
    assert run(engine, [follow]) == keep_everything(engines, "gemma3_text", 8, [follow])
    assert engine._scheduler.counters.num_cached_tokens - cached == len(history)
