"""One strata engine as a Ray Serve replica: a whole `strata serve` app, run in process.

`forward` answers a front-door request through the app (so routes, errors and streams
are a single server's), after pulling the prompt's prefix from the replica that holds it
when the router chose this one instead (`holder` in the request: a migration). The
conversation's K/V travels as a session file's bytes through Ray's object store and is
restored here parked, so the request forks it like any held prefix and reports it in
`cached_tokens`. `record_routing_stats` is Serve's hook: what the router reads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from strata.cluster.forward import ForwardedRequest, ResponseStart, run_asgi
from strata.cluster.keys import KeyCache, matched_tokens
from strata.cluster.scaling import OCCUPANCY
from strata.config import EngineConfig
from strata.errors import StrataError
from strata.server.settings import ServerSettings

log = logging.getLogger("strata.cluster")
REPLICA_HEADER = b"x-strata-replica"
MIGRATED_HEADER = b"x-strata-migrated-tokens"
ROUTE_HEADER = b"x-strata-route"
REPORT_HEADER = b"x-strata-report-seq"  # routing reports this replica had made when it answered
# A holder that has not answered an export by then (stuck, stopped, or gone before the export
# reached it: a request pinned to a replica that is no more waits for it) is passed over and
# the turn computed here. An export is one session file of at most --max-context cells.
EXPORT_TIMEOUT_S = 10.0


@dataclass
class ExportRequest:
    """Asks the replica `pin` for the session file of its longest idle prefix of `token_ids`."""

    token_ids: list[int]
    pin: str


@dataclass(frozen=True)
class Exported:
    data: bytes  # a session file
    num_cells: int


class StrataReplica:
    """The deployment's class; `cluster.app.build_app` wraps it with `serve.deployment`."""

    async def __init__(self, config: EngineConfig, settings: ServerSettings, model_id: str, block: int):
        from ray import serve

        from strata.engine.interface import Engine
        from strata.server.app import create_app
        from strata.server.responses_api.store import ResponseStore

        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        self._self_handle = (context.deployment, context.app_name)
        self.app = create_app(settings, lambda: Engine(config, progress=False), model_id)
        # its response ids name this replica: the front door sends their follow-ups here
        self.app.state.responses = ResponseStore(owner=self.replica_id)
        self.app.state.strata_stopping = lambda: False
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()
        self.state = self.app.state.strata
        # Serve counts a replica as running once __init__ returns: not before the model is
        # loaded (the engine thread loads it), so no request or probe meets a loading engine.
        while self.state.loop.state == "loading":
            await asyncio.sleep(0.05)
        if self.state.loop.state != "ready":
            raise RuntimeError(f"strata replica: the model failed to load: {self.state.loop.load_error}")
        self.keys = KeyCache(block)
        self.block = block
        self._held: set[int] = set()
        self._seq = 0
        self.num_migrations = 0
        from prometheus_client import Gauge

        self.migrating = Gauge("strata_migrations_in_progress", "prefixes this replica is pulling from their holders",
                               registry=self.state.metrics.registry)  # on its /metrics, beside strata serve's

    # ---- requests -------------------------------------------------------------------------
    async def forward(self, req: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
        migrated = 0
        if req.holder is not None and req.holder != self.replica_id and req.prompt_ids:
            migrated = await self._migrate(req)
        async for message in run_asgi(self.app, req, ("127.0.0.1", 0)):
            if message["type"] == "http.response.start":
                extra = [(REPLICA_HEADER, self.replica_id.encode()), (ROUTE_HEADER, req.route.encode()),
                         (REPORT_HEADER, str(self._seq).encode())]
                if migrated:
                    extra.append((MIGRATED_HEADER, str(migrated).encode()))
                yield ResponseStart(message["status"], list(message.get("headers", [])) + extra, self.replica_id,
                                    migrated)
            elif message["type"] == "http.response.body" and message.get("body"):
                yield bytes(message["body"])

    async def export(self, req: ExportRequest) -> Exported | None:
        """The longest idle prefix of `req.token_ids` this replica holds, as a session file."""
        fd, path = tempfile.mkstemp(prefix="strata-migrate-", suffix=".session")
        os.close(fd)
        try:  # the idle conversation sharing most with the prompt (a running one cannot be saved)
            saved = await self.state.loop.session(
                lambda e: e.begin_save_session(path, token_ids=req.token_ids, idle_only=True))
            with open(path, "rb") as f:
                return Exported(f.read(), saved.num_cells)
        except StrataError as exc:  # busy (a request extends it), gone, or not ready
            log.info("replica %s: nothing to export (%s)", self.replica_id, exc)
            return None
        finally:
            os.unlink(path)

    async def _migrate(self, req: ForwardedRequest) -> int:
        """Pulls the holder's prefix of the prompt unless this replica holds as much; returns
        the cells restored (0: the request prefills here what it must)."""
        if matched_tokens(req.prefix_keys, self.block, self._held) >= req.holder_tokens:
            return 0
        with self.migrating.track_inprogress():
            return await self._pull(req)

    async def _pull(self, req: ForwardedRequest) -> int:
        from ray import serve

        t0 = time.perf_counter()
        handle = serve.get_deployment_handle(*self._self_handle)
        response = handle.export.remote(ExportRequest(req.prompt_ids, req.holder))

        async def exported_prefix() -> Exported | None:
            return await response

        try:
            exported = await asyncio.wait_for(exported_prefix(), EXPORT_TIMEOUT_S)
        except asyncio.TimeoutError:
            response.cancel()
            log.warning("replica %s: %s did not export in %.0f s: recomputing", self.replica_id, req.holder,
                        EXPORT_TIMEOUT_S)
            return 0
        except Exception as exc:  # noqa: BLE001 - the holder died or left: recompute instead
            log.warning("replica %s: migration from %s failed (%s): recomputing", self.replica_id, req.holder, exc)
            return 0
        if exported is None:
            return 0
        fd, path = tempfile.mkstemp(prefix="strata-migrate-", suffix=".session")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(exported.data)
            await self.state.loop.session(lambda e: e.begin_restore_session(path))
        except StrataError as exc:  # no room here either: the prompt is computed
            log.warning("replica %s: could not restore a migrated prefix (%s)", self.replica_id, exc)
            return 0
        finally:
            os.unlink(path)
        self.num_migrations += 1
        log.info("replica %s: migrated %d cells from %s in %.3f s", self.replica_id, exported.num_cells,
                 req.holder, time.perf_counter() - t0)
        return exported.num_cells

    # ---- what the router reads -----------------------------------------------------------------
    async def record_routing_stats(self) -> dict:
        """Free and evictable cells, lanes, queue, and the prefix keys of every held conversation."""
        loop = self.state.loop
        snap = loop.snapshot
        if loop.state != "ready" or snap is None:
            return {"replica": self.replica_id, "ready": False}
        convs = await loop.call(lambda e: e.held_conversations())
        self._held = self.keys.keys(convs)
        self._seq += 1
        chunk = snap.pool.chunk_size
        return {
            "replica": self.replica_id,
            "ready": True,
            "seq": self._seq,
            "block": self.block,
            "keys": sorted(self._held),
            "free_cells": snap.pool.num_chunks_free * chunk,
            "evictable_cells": snap.pool.num_chunks_parked * chunk,
            "lanes": len(snap.lanes),
            "running": snap.num_running,
            "waiting": snap.num_queued,
            "migrations": self.num_migrations,
        }

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's autoscaling hook (scaling.py): the pool's share held by running requests."""
        snap = self.state.loop.snapshot
        if snap is None or snap.pool.num_chunks_total == 0:
            return {OCCUPANCY: 0.0}
        return {OCCUPANCY: snap.num_chunks_active / snap.pool.num_chunks_total}

    async def check_health(self) -> None:
        """Serve's health check: a replica whose model failed to load is replaced."""
        if self.state.loop.state in ("failed", "stopped"):
            raise RuntimeError(f"strata replica {self.replica_id}: engine {self.state.loop.state}")

    def __del__(self) -> None:
        # Serve is removing this replica: its running requests end, its parked conversations
        # are dropped with its memory (their next turns are recomputed or served elsewhere).
        self.state.loop.stop(timeout=5)
