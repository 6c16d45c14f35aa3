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
from collections.abc import Callable
from dataclasses import dataclass, field

from strata.cells.session import SessionReader, check_compatible, save_cells, storage_geometry
from strata.cells.storage import KVStorage
from strata.engine.conversation import Conversation
from strata.engine.prefix_index import common_prefix_len
from strata.engine.scheduler import Scheduler
from strata.errors import LaneBusy, PoolFullError, RequestError, SessionFileError
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
    token_ids: tuple[int, ...] = ()  # the restored conversation's tokens (a follow-up extends them)


class SessionFiles:
    """The engine's session files: its scheduler's conversations and its K/V storage."""

    def __init__(self, scheduler: Scheduler, kv: KVStorage, fingerprint: str, vocab_size: int,
                 retry_after: Callable[[], int]):
        self._scheduler = scheduler
        self._kv = kv
        self._fingerprint = fingerprint
        self._vocab_size = vocab_size
        self._retry_after = retry_after

    def _check_lane(self, lane: int) -> None:
        num_lanes = len(self._scheduler.lanes)
        if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < num_lanes:
            raise RequestError(f"slot id must be in [0, {num_lanes}), got {lane!r}", code="invalid_slot", param="id")

    def _conversation(self, lane: int | None, token_ids: list[int] | None,
                      idle_only: bool) -> tuple[Conversation, int]:
        """The idle conversation to save and how many of its cells: a lane's, the one that holds
        the longest prefix of `token_ids`, or (`idle_only`) the idle one sharing most with it."""
        if lane is not None:
            self._check_lane(lane)
            slot = self._scheduler.lanes[lane]
            if slot.is_busy:
                raise LaneBusy(lane, "save")
            if slot.conv is None:
                raise RequestError(f"slot {lane} holds no conversation to save", code="slot_empty")
            return slot.conv, slot.conv.num_cells
        tokens = list(token_ids or ())
        if idle_only:
            found = [(common_prefix_len(c.token_ids, tokens), c) for c in self._scheduler.cache if not c.is_active]
            n, conv = max(found, key=lambda f: f[0], default=(0, None))
            if not n:
                raise RequestError("no idle conversation shares a prefix with these tokens", code="session_not_found")
            return conv, n
        conv, n = self._scheduler.cache.longest_prefix(tokens)
        if conv is None:
            raise RequestError("no held conversation starts with these tokens", code="session_not_found")
        if conv.is_active:
            raise LaneBusy(conv.lane, "save")
        return conv, n

    def save(self, path: str, lane: int | None = None, token_ids: list[int] | None = None,
             metadata: dict | None = None, idle_only: bool = False) -> SessionSaved:
        """Writes an idle conversation (lane `lane`'s, or the longest held prefix of `token_ids`) to
        `path`, with the application's JSON `metadata` in the header."""
        t0 = time.perf_counter()
        conv, n = self._conversation(lane, token_ids, idle_only)
        header = SessionHeader(
            self._fingerprint, storage_geometry(self._kv), self._scheduler.layout.chunk_size,
            conv.token_ids[:n], [c for c in conv.checkpoints if c <= n], dict(metadata or {}),
        )
        num_bytes = save_cells(path, header, self._kv, conv.table.chunk_ids)
        return SessionSaved(path, n, num_bytes, time.perf_counter() - t0)

    def restore(self, path: str, lane: int | None = None) -> SessionRestored:
        """Holds the conversation of the session file `path` again, idle (see the module doc)."""
        t0 = time.perf_counter()
        lanes = self._scheduler.lanes
        if lane is not None:
            self._check_lane(lane)
            if lanes[lane].is_busy:
                raise LaneBusy(lane, "restore into")
        with SessionReader.open(path) as reader:
            h = reader.header
            check_compatible(h, path, self._fingerprint, storage_geometry(self._kv))
            if h.num_cells > self._scheduler.max_context:
                raise SessionFileError(path, f"{h.num_cells} cells, more than --max-context "
                                             f"{self._scheduler.max_context}", code="context_length_exceeded")
            if any(not 0 <= t < self._vocab_size for t in h.token_ids):
                raise SessionFileError(path, f"token ids outside this model's vocabulary [0, {self._vocab_size})")
            plan = lanes.plan_restore(h.num_cells, lane)
            if plan is None:
                pool = self._scheduler.layout.pool
                raise PoolFullError(chunks_for(h.num_cells, pool.chunk_size), pool.num_free, self._retry_after())
            if plan.loses_conversations:
                reader.verify()  # a bad record must not cost anyone their conversation
            table = lanes.take_restore(plan)
            try:
                reader.restore_cells(self._kv, table.chunk_ids)
            except BaseException:
                lanes.drop_restore(table)
                raise
            conv = lanes.finish_restore(plan, table, h.token_ids, h.checkpoints)
            num_bytes = reader.num_bytes
        return SessionRestored(path, conv.conv_id, conv.lane, conv.num_cells, num_bytes, time.perf_counter() - t0,
                               plan.loses_conversations, h.metadata, tuple(h.token_ids))

    def erase(self, lane: int) -> int:
        """Drops lane `lane`'s idle conversation; returns the cells it held (llama.cpp's n_erased)."""
        self._check_lane(lane)
        if self._scheduler.lanes[lane].is_busy:
            raise LaneBusy(lane, "erase")
        return self._scheduler.lanes.erase(lane)
