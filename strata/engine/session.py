"""Saving and restoring a conversation through a session file (the engine's side), off the
step path: the engine's thread checks and holds, a worker thread streams the bytes while the
engine goes on stepping, and the engine's thread settles the result between two steps.

Save: the conversation must be idle when the save starts (a request extending it is refused
with `LaneBusy`); the save then holds a snapshot of its chunk table in every layer group
(engine/holds.py), so the conversation may be extended, branched or evicted while the file is
written, and the file holds exactly the cells it had when the save began. With sliding-window
layer groups (kv/groups.py) the file is version 2: the full group's every cell, and in each
windowed group the cells of the chunks of its last window and of the kept windows every
windowed group holds (kv/session_groups.py).

Restore, all or nothing: the header is read and checked first on the engine's thread (model
fingerprint, K/V geometry and dtype, version, the file's size against the header, its layer
groups against the engine's and that it holds every cell the engine's groups would read),
then room is planned in every group (`Lanes.plan_restore`: idle conversations give way LRU
first; in the windowed groups kept windows give way first, the file's own oldest ones before
any conversation; no room is a `PoolFullError`, kv_pool_full). When taking the room would
evict a conversation for good (or drop another's kept windows), every record's checksum is
verified on the worker before anything changes (and room is planned again after). Then the
room is taken in every group, held by no conversation, and each record is streamed into its
cells; only when every checksum passed does the conversation become visible, idle: parked,
or in the lane asked for. Any error gives the room back in every group, and the pool,
the lanes and the cache are as they were (the K/V of free chunks aside). A request that
extends the conversation being restored waits for it; an erase of its lane wins.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from strata.cells.session import (GroupCells, SessionReader, announce_written, check_compatible, check_groups,
                                  save_cells, storage_geometry)
from strata.cells.storage import KVStorage
from strata.engine.conversation import Conversation
from strata.engine.holds import RestoreHold, SaveHold
from strata.engine.prefix_index import common_prefix_len
from strata.engine.scheduler import Scheduler
from strata.engine.session_jobs import SessionJob, SessionWorker
from strata.errors import LaneBusy, PoolFullError, RequestError, RestoreCancelled, SessionFileError
from strata.engine.session_groups import file_header, restore_kept
from strata.kv.session_groups import held_spans
from strata.kv.table import chunks_for

OnRecord = Callable[[int], None]


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


class _Dropped(Exception):
    """Raised in the worker between records: an erase of the restore's lane won."""


@dataclass(eq=False)
class _Flight:
    job: SessionJob
    hold: SaveHold | RestoreHold
    reader: SessionReader | None = None
    work: object = None  # the worker's Future for the current pass
    verifying: bool = False
    verified_first: bool = False
    on_record: OnRecord | None = None  # the caller's hook, after each record the stream writes or reads
    cancel: threading.Event = field(default_factory=threading.Event)
    targets: list = field(default_factory=list)  # a restore's GroupCells, one per group (what it writes)


class SessionFiles:
    """The engine's session files: its scheduler's conversations and its K/V storage."""

    def __init__(self, scheduler: Scheduler, kv: KVStorage, fingerprint: str, vocab_size: int,
                 retry_after: Callable[[], int]):
        self._scheduler = scheduler
        self._holds = scheduler.holds
        self._kv = kv
        self._fingerprint = fingerprint
        self._vocab_size = vocab_size
        self._retry_after = retry_after
        self.worker = SessionWorker()
        self._flights: list[_Flight] = []

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    def _check_lane(self, lane: int, what: str) -> None:
        num_lanes = len(self._scheduler.lanes)
        if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < num_lanes:
            raise RequestError(f"slot id must be in [0, {num_lanes}), got {lane!r}", code="invalid_slot", param="id")
        slot = self._scheduler.lanes[lane]
        if slot.is_busy:
            raise LaneBusy(lane, what)
        if slot.is_pinned and what != "erase":
            raise LaneBusy(lane, what, "held by a session file in flight", "it is written or read")

    def _conversation(self, lane: int | None, token_ids: list[int] | None,
                      idle_only: bool) -> tuple[Conversation, int]:
        """The idle conversation to save and how many of its cells: a lane's, the one that holds
        the longest prefix of `token_ids`, or (`idle_only`) the idle one sharing most with it."""
        if lane is not None:
            self._check_lane(lane, "save")
            slot = self._scheduler.lanes[lane]
            if slot.conv is None:
                raise RequestError(f"slot {lane} holds no conversation to save", code="slot_empty")
            return slot.conv, slot.conv.num_cells
        tokens = list(token_ids or ())
        if idle_only:
            found = [(common_prefix_len(c.token_ids, tokens), c) for c in self._scheduler.cache if not c.is_active]
            n, conv = max(found, key=lambda f: f[0], default=(0, None))
            if not n:
                raise RequestError("no idle conversation shares a prefix with these tokens", code="session_not_found")
        else:
            conv, n = self._scheduler.cache.longest_prefix(tokens)
            if conv is None:
                raise RequestError("no held conversation starts with these tokens", code="session_not_found")
            if conv.is_active:
                raise LaneBusy(conv.lane, "save")
        n = self._scheduler.layout.reusable(conv.table, n)  # windowed groups hold the window before n
        if not n:
            raise RequestError("no held conversation holds the windows before these tokens", code="session_not_found")
        if conv.lane is not None and self._scheduler.lanes[conv.lane].is_pinned and not self._scheduler.layout.shares_chunks:
            raise LaneBusy(conv.lane, "save", "held by a session file in flight", "it is written or read")
        return conv, n

    def _progress(self, flight: _Flight, on_record: OnRecord | None) -> OnRecord:
        def step(i: int) -> None:  # on the worker, after each record
            flight.job.records_done = i + 1
            if flight.cancel.is_set():
                raise _Dropped()
            if on_record is not None:
                on_record(i)
        return step

    # ---- starting ---------------------------------------------------------------------------
    def begin_save(self, path: str, lane: int | None = None, token_ids: list[int] | None = None,
                   metadata: dict | None = None, idle_only: bool = False, on_record: OnRecord | None = None
                   ) -> SessionJob:
        """Starts writing an idle conversation (lane `lane`'s, or the longest held prefix of
        `token_ids`) to `path`, with the application's JSON `metadata` in the header."""
        conv, n = self._conversation(lane, token_ids, idle_only)
        header = file_header(self._fingerprint, storage_geometry(self._kv), self._kv.groups,
                             self._scheduler.layout.chunk_size, conv, n, dict(metadata or {}))
        hold = self._holds.hold_save(conv, n, header.windows_kept)
        flight = _Flight(SessionJob("save", path, conv.lane, n, header.num_records), hold)
        progress = self._progress(flight, on_record)
        ids = [hold.table.chunk_ids, *(w.chunk_ids for w in hold.table.windows)]
        flight.work = self.worker.submit(lambda: save_cells(path, header, self._kv, ids, progress))
        self._flights.append(flight)
        return flight.job

    def begin_restore(self, path: str, lane: int | None = None, on_record: OnRecord | None = None) -> SessionJob:
        """Starts holding the conversation of the session file `path` again (see the module doc)."""
        if lane is not None:
            self._check_lane(lane, "restore into")
        reader = SessionReader.open(path)
        try:
            h = reader.header
            check_compatible(h, path, self._fingerprint, storage_geometry(self._kv))
            check_groups(h, path, self._kv.groups)
            if h.num_cells > self._scheduler.max_context:
                raise SessionFileError(path, f"{h.num_cells} cells, more than --max-context "
                                             f"{self._scheduler.max_context}", code="context_length_exceeded")
            if any(not 0 <= t < self._vocab_size for t in h.token_ids):
                raise SessionFileError(path, f"token ids outside this model's vocabulary [0, {self._vocab_size})")
            kept = restore_kept(h, path, self._kv.groups, self._scheduler.layout.chunk_size)
            plan = self._scheduler.lanes.plan_restore(h.num_cells, lane, kept)
            if plan is None:
                raise self._pool_full(h.num_cells)
        except BaseException:
            reader.close()
            raise
        hold = self._holds.begin_restore(h.token_ids, h.checkpoints, plan.lane, kept)
        flight = _Flight(SessionJob("restore", path, plan.lane, h.num_cells, h.num_records), hold, reader,
                         on_record=on_record)
        if plan.loses_conversations:  # a bad record must not cost anyone their conversation
            flight.verifying = flight.verified_first = True
            flight.work = self.worker.submit(reader.verify)
        else:
            self._stream(flight, plan)
        self._flights.append(flight)
        return flight.job

    def _stream(self, flight: _Flight, plan) -> None:
        table = self._holds.take(flight.hold, plan)
        progress = self._progress(flight, flight.on_record)
        n = table.num_cells
        targets = [GroupCells(table.chunk_ids, ((0, n),)), *(
            GroupCells(w.chunk_ids, held_spans(w.window, w.pool.chunk_size, n, w.kept)) for w in table.windows)]
        flight.targets = targets
        flight.work = self.worker.submit(lambda: flight.reader.restore_cells(self._kv, targets, progress))

    def _pool_full(self, num_cells: int) -> PoolFullError:
        pool = self._scheduler.layout.pool
        return PoolFullError(chunks_for(num_cells, pool.chunk_size), pool.num_free, self._retry_after())

    # ---- settling, between steps -----------------------------------------------------------
    def settle(self) -> int:
        """Ends every session file whose stream is done (the engine's thread, between steps);
        returns how many ended."""
        ended = sum(self._settle(f) for f in list(self._flights) if f.work.done())
        if ended:
            self._scheduler.unblock()
        return ended

    def _settle(self, flight: _Flight) -> bool:
        job, hold, error = flight.job, flight.hold, flight.work.exception()
        if isinstance(hold, SaveHold):
            self._holds.release_save(hold)
            return self._end(flight, error, lambda: SessionSaved(job.path, job.num_cells, flight.work.result(),
                                                                 time.perf_counter() - job.started))
        if hold.dropped:
            error = RestoreCancelled(job.path, hold.lane)
        if error is None and flight.verifying:
            flight.verifying = False
            plan = self._holds.plan_restore(hold)
            if plan is not None:
                self._stream(flight, plan)
                return False
            error = self._pool_full(hold.num_cells)
        if error is not None:
            self._holds.drop(hold)
            return self._end(flight, error, None)
        announce_written(self._kv, flight.targets)
        conv = self._holds.finish(hold)
        reader = flight.reader
        return self._end(flight, None, lambda: SessionRestored(
            job.path, conv.conv_id, conv.lane, conv.num_cells, reader.num_bytes, time.perf_counter() - job.started,
            flight.verified_first, reader.header.metadata, tuple(reader.header.token_ids)))

    def _end(self, flight: _Flight, error: BaseException | None, result: Callable[[], object] | None) -> bool:
        self._flights.remove(flight)
        if flight.reader is not None:
            flight.reader.close()
        if error is not None:
            flight.job.result.set_exception(error)
        else:
            flight.job.result.set_result(result())
        return True

    def wait(self, job: SessionJob):
        """Settles session files until `job` ends; its result (or raises its error)."""
        while not job.done:
            self.worker.wait_any(f.work for f in self._flights)
            self.settle()
        return job.result.result()

    def wait_any(self, timeout: float | None = None) -> None:
        if self._flights:
            self.worker.wait_any((f.work for f in self._flights), timeout)

    def close(self) -> None:
        """Lets every session file in flight end (their files complete or removed) and settles them."""
        while self._flights:
            self.wait(self._flights[0].job)
        self.worker.shutdown()

    def abandon(self, error: BaseException) -> None:
        """The engine's thread is ending on a fault: every job in flight ends with `error`
        (nothing is settled; the worker finishes what it writes)."""
        for flight in self._flights:
            flight.cancel.set()
            if not flight.job.done:
                flight.job.result.set_exception(error)
        self._flights.clear()

    # ---- erasing ----------------------------------------------------------------------------
    def erase(self, lane: int) -> int:
        """Drops lane `lane`'s idle conversation; returns the cells it held (llama.cpp's n_erased).
        A restore into the lane is dropped (the erase wins); a save that holds the lane refuses."""
        self._check_lane(lane, "erase")
        if self._scheduler.lanes[lane].is_pinned:
            hold = self._holds.drop_lane(lane)
            if hold is None:
                raise LaneBusy(lane, "erase", "being saved", "the save ends")
            next(f for f in self._flights if f.hold is hold).cancel.set()
            self._scheduler.unblock()
        return self._scheduler.lanes.erase(lane)
