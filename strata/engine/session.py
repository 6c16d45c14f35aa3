"""Saving and restoring a conversation through a session file (the engine's side).

Save: the conversation must be idle (a request extending it is refused with `LaneBusy`:
the engine saves between steps, and an idle conversation cannot change under it).

Restore, all or nothing: the header is read and checked first (model fingerprint, K/V
geometry and dtype, version, and the file's size against the header), then room is
planned (`Lanes.plan_restore`: idle conversations give way LRU first; no room is a
`PoolFullError`, kv_pool_full). When taking the room would evict a conversation for good,
every record's checksum is verified before anything changes; then the chunks are taken
and each record streamed into its cells. Any error on the way gives the chunks back, and
the pool, the lanes and the cache are as they were (the K/V of free chunks aside). The
restored conversation is idle: parked, or in the lane asked for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from strata.engine.conversation import Conversation
from strata.errors import LaneBusy, PoolFullError, RequestError, SessionFileError
from strata.cells.session import SessionReader, check_compatible, save_cells, storage_geometry
from strata.kv.session_format import SessionHeader
from strata.kv.table import chunks_for


@dataclass(frozen=True)
class SessionSaved:
    path: str
    num_cells: int
    num_bytes: int  # the file's size
    seconds: float


@dataclass(frozen=True)
class SessionRestored:
    path: str
    conv_id: int
    lane: int | None  # None: parked without a lane
    num_cells: int
    num_bytes: int  # the file's size (every byte was read)
    seconds: float
    verified_first: bool  # the checksums were checked in a pass before any conversation gave way
    metadata: dict = field(default_factory=dict)  # the header's application metadata, as saved


def _check_lane(engine, lane: int) -> None:
    num_lanes = len(engine.scheduler.lanes)
    if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < num_lanes:
        raise RequestError(f"slot id must be in [0, {num_lanes}), got {lane!r}", code="invalid_slot", param="id")


def _conversation(engine, lane: int | None, token_ids: list[int] | None) -> tuple[Conversation, int]:
    """The idle conversation to save and how many of its cells: a lane's, or the one that
    holds the longest prefix of `token_ids`."""
    if lane is not None:
        _check_lane(engine, lane)
        slot = engine.scheduler.lanes[lane]
        if slot.is_busy:
            raise LaneBusy(lane, "save")
        if slot.conv is None:
            raise RequestError(f"slot {lane} holds no conversation to save", code="slot_empty")
        return slot.conv, slot.conv.num_cells
    conv, n = engine.scheduler.cache.longest_prefix(list(token_ids or ()))
    if conv is None:
        raise RequestError("no held conversation starts with these tokens", code="session_not_found")
    if conv.is_active:
        raise LaneBusy(conv.lane, "save")
    return conv, n


def save_session(engine, path: str, lane: int | None = None, token_ids: list[int] | None = None,
                 metadata: dict | None = None) -> SessionSaved:
    """Writes an idle conversation (lane `lane`'s, or the longest held prefix of `token_ids`) to
    `path`, with the application's JSON `metadata` in the header."""
    t0 = time.perf_counter()
    conv, n = _conversation(engine, lane, token_ids)
    header = SessionHeader(
        engine.fingerprint, storage_geometry(engine.kv), engine.layout.chunk_size,
        conv.token_ids[:n], [c for c in conv.checkpoints if c <= n], dict(metadata or {}),
    )
    num_bytes = save_cells(path, header, engine.kv, conv.table.chunk_ids)
    return SessionSaved(path, n, num_bytes, time.perf_counter() - t0)


def restore_session(engine, path: str, lane: int | None = None) -> SessionRestored:
    """Holds the conversation of the session file `path` again, idle (see the module doc)."""
    t0 = time.perf_counter()
    scheduler = engine.scheduler
    if lane is not None:
        _check_lane(engine, lane)
        if scheduler.lanes[lane].is_busy:
            raise LaneBusy(lane, "restore into")
    with SessionReader.open(path) as reader:
        h = reader.header
        check_compatible(h, path, engine.fingerprint, storage_geometry(engine.kv))
        if h.num_cells > engine.max_context:
            raise SessionFileError(path, f"{h.num_cells} cells, more than --max-context {engine.max_context}",
                                   code="context_length_exceeded")
        vocab = engine.model_config.vocab_size
        if any(not 0 <= t < vocab for t in h.token_ids):
            raise SessionFileError(path, f"token ids outside this model's vocabulary [0, {vocab})")
        plan = scheduler.lanes.plan_restore(h.num_cells, lane)
        if plan is None:
            pool = engine.layout.pool
            raise PoolFullError(chunks_for(h.num_cells, pool.chunk_size), pool.num_free, engine.retry_after())
        if plan.loses_conversations:
            reader.verify()  # a bad record must not cost anyone their conversation
        table = scheduler.lanes.take_restore(plan)
        try:
            reader.restore_cells(engine.kv, table.chunk_ids)
        except BaseException:
            scheduler.lanes.drop_restore(table)
            raise
        conv = scheduler.lanes.finish_restore(plan, table, h.token_ids, h.checkpoints)
        num_bytes = reader.num_bytes
    return SessionRestored(path, conv.conv_id, conv.lane, conv.num_cells, num_bytes, time.perf_counter() - t0,
                           plan.loses_conversations, h.metadata)


def erase_lane(engine, lane: int) -> int:
    """Drops lane `lane`'s idle conversation; returns the cells it held (llama.cpp's n_erased)."""
    _check_lane(engine, lane)
    if engine.scheduler.lanes[lane].is_busy:
        raise LaneBusy(lane, "erase")
    return engine.scheduler.lanes.erase(lane)
