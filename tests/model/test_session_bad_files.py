"""Every bad session file is a clear error that leaves the engine exactly as it was.

"As it was": the pool's free list, every refcount, the lanes, every conversation (ids,
tokens, checkpoints, lane, LRU clock, chunk table) and the K/V of every held chunk. Each
file is tried where the pool has room (the records stream into taken chunks, which go
back on the error), where it must evict a parked conversation first (the checksums are
verified before anyone gives way), into a lane holding an idle conversation, and in the
reserved layout (whose lane reservation takes the K/V).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct

import pytest
import torch
from tests.conftest import make_tiny_model

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.errors import SessionFileError
from strata.cells.session import layer_parts
from strata.kv.session_format import CRC, PREFIX, crc32, read_header
from strata.loader.fingerprint import weights_fingerprint
from strata.loader.hf_dir import hf_model_config
from strata.sampling import SamplingParams
from tests.checks import check_scheduler

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
CHUNK = 16


def engine(model_dir: str, pool_chunks: int | None, kv: str = "f32") -> Engine:
    pool = {"kv_pool_tokens": pool_chunks * CHUNK} if pool_chunks else {}
    cfg = EngineConfig(model=model_dir, dtype="float32", max_context=96, kv_chunk=CHUNK, batch=1, kv=kv, **pool)
    return Engine(cfg, progress=False)


def converse(e: Engine, prompt: list[int]) -> None:
    e.submit(prompt, GREEDY)
    e.run_until_done()


def state(e: Engine) -> dict:
    pool, cache = e._layout.pool, e._scheduler.cache
    convs = sorted(
        (c.conv_id, tuple(c.token_ids), tuple(c.checkpoints), c.lane, c.last_used, c.is_active,
         tuple(c.table.chunk_ids), c.table.num_cells)
        for c in cache
    )
    held = sorted({i for c in cache for i in c.table.chunk_ids})
    kv = [t[:, i * CHUNK : (i + 1) * CHUNK].clone() for layer in layer_parts(e._kv) for t in layer for i in held]
    return {
        "free": pool.free_ids(), "refcounts": [pool.refcount(i) for i in range(pool.num_total)],
        "num_held": pool.num_held, "conversations": convs, "next_id": cache._next_id,
        "lanes": [(lane.conv and lane.conv.conv_id, lane.seq) for lane in e._scheduler.lanes],
        "counters": e._scheduler.counters, "kv": kv,
    }


def same(a: dict, b: dict) -> bool:
    kv_a, kv_b = a.pop("kv"), b.pop("kv")
    return a == b and len(kv_a) == len(kv_b) and all(torch.equal(x, y) for x, y in zip(kv_a, kv_b))


@pytest.fixture(scope="module")
def files(tiny_llama_dir, tmp_path_factory, smol_tokenizer) -> dict[str, str]:
    """A good file (41 cells: three records of 16, 16 and 9) and every bad one."""
    d = tmp_path_factory.mktemp("sessions")
    e = engine(tiny_llama_dir, 12)
    converse(e, list(range(200, 236)))
    good = str(d / "good.strata")
    e.save_session(good, lane=0)
    data = open(good, "rb").read()
    with open(good, "rb") as f:
        header, hb = read_header(f, good)
    rec = 16 * header.geometry.bytes_per_cell + CRC.size
    bad = {
        "empty": b"",
        "magic only": data[:8],
        "cut in header": data[: hb - 10],
        "cut after header": data[:hb],
        "cut in record 0": data[: hb + 100],
        "cut in last record": data[: hb + 2 * rec + 50],
        "last byte missing": data[:-1],
        "one byte extra": data + b"\0",
        "flipped byte in header": flip(data, PREFIX.size + 20),
        "flipped byte in record 0": flip(data, hb + 7),
        "flipped byte in last record": flip(data, len(data) - 40),
        "flipped checksum": flip(data, hb + rec - 1),
        "future version": data[:8] + struct.pack("<I", 3) + data[12:],
        "other geometry": rewrite(data, hb, b'"num_kv_heads":2', b'"num_kv_heads":1'),
        "bad magic": b"NOTSTRAT" + data[8:],
    }
    paths = {name: str(d / f"{i}.strata") for i, name in enumerate(bad)}
    for name, content in bad.items():
        open(paths[name], "wb").write(content)
    paths["a directory"] = str(d)
    paths["missing"] = str(d / "absent.strata")
    other = make_tiny_model("llama", str(d / "other"), smol_tokenizer, initializer_range=0.1)  # same shapes
    o = engine(other, 12)
    converse(o, list(range(200, 236)))
    paths["other model"] = str(d / "other.strata")
    o.save_session(paths["other model"], lane=0)
    b = engine(tiny_llama_dir, 12, kv="bf16")
    converse(b, list(range(200, 236)))
    paths["other K/V dtype"] = str(d / "bf16.strata")
    b.save_session(paths["other K/V dtype"], lane=0)
    return {"good": good, **paths}


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :]


def rewrite(data: bytes, hb: int, old: bytes, new: bytes) -> bytes:
    """The header edited and its CRC made right again, so only the edit is wrong."""
    body = data[PREFIX.size : hb - CRC.size].replace(old, new)
    head = data[:8] + struct.pack("<II", 1, len(body)) + body
    return head + CRC.pack(crc32(head)) + data[hb:]


BAD = ["empty", "magic only", "cut in header", "cut after header", "cut in record 0", "cut in last record",
       "last byte missing", "one byte extra", "flipped byte in header", "flipped byte in record 0",
       "flipped byte in last record", "flipped checksum", "future version", "other geometry", "bad magic",
       "a directory", "missing", "other model", "other K/V dtype"]
# (pool chunks or None for reserved, lane to restore into)
SETTINGS = [(12, None), (7, None), (12, 0), (None, 1)]


@pytest.mark.parametrize(("pool_chunks", "lane"), SETTINGS, ids=["room", "evicts", "into-lane", "reserved"])
def test_every_bad_file_leaves_the_engine_as_it_was(tiny_llama_dir, files, pool_chunks, lane):
    e = engine(tiny_llama_dir, pool_chunks)
    converse(e, list(range(300, 330)))  # lane 0: idle, 35 cells (3 chunks)
    converse(e, list(range(400, 410)) + list(range(500, 520)))  # lane 1
    if pool_chunks:
        e.park(1)  # parked: 3 chunks
    check_scheduler(e._scheduler)
    before = state(e)
    for name in BAD:
        with pytest.raises(SessionFileError) as err:
            e.restore_session(files[name], lane=lane)
        assert str(err.value).startswith(f"session file {files[name]}: "), name
        assert same(state(e), before), name
        before = state(e)
    check_scheduler(e._scheduler)
    restored = e.restore_session(files["good"], lane=lane)  # the control: a good file changes the state
    assert restored.verified_first == (pool_chunks == 7 or pool_chunks is None)
    assert not same(state(e), before)
    check_scheduler(e._scheduler)


def test_a_rollback_after_streaming_gives_back_every_chunk(tiny_llama_dir, files):
    """A flipped byte in the last record is found after two records were written to taken chunks."""
    e = engine(tiny_llama_dir, 12)
    converse(e, list(range(300, 330)))
    before = state(e)
    taken = []  # the chunks the restore took, seen as it took them
    real = e._scheduler.lanes.take_restore

    def take(plan):
        table = real(plan)
        taken.append(list(table.chunk_ids))
        return table

    e._scheduler.lanes.take_restore = take
    with pytest.raises(SessionFileError, match="record 2 .*checksum mismatch"):
        e.restore_session(files["flipped byte in last record"])
    assert taken == [[6, 7, 8]] and same(state(e), before)  # a new run halfway into the free ids 3..11


def test_fine_tunes_of_one_architecture_have_different_fingerprints(tiny_llama_dir, files):
    other = os.path.join(os.path.dirname(files["good"]), "other")
    config = hf_model_config(tiny_llama_dir)
    assert dataclasses.replace(hf_model_config(other), name=config.name) == config  # same architecture, shapes
    assert weights_fingerprint(other, hf_model_config(other)) != weights_fingerprint(tiny_llama_dir, config)
    copy = shutil.copytree(tiny_llama_dir, os.path.join(os.path.dirname(other), "copy"))
    assert weights_fingerprint(copy, hf_model_config(copy)) == weights_fingerprint(tiny_llama_dir, config)
