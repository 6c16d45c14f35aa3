"""The cluster's Ray Serve request router: by cached prefix, then free K/V, then load.

For a request with a prompt, in order:
1. the replica holding the longest prefix of its prompt (exactly: the prefix keys every
   replica reports, keys.py), unless that replica is overloaded (its ongoing requests
   fill its lanes and exceed the least loaded replica's by `imbalance`) or its pool
   cannot admit the turn (free + evictable cells below what the turn adds);
2. otherwise the replica with the most free pool cells, counting the cells of requests
   routed to it since its last report (so a burst is spread, not piled on one replica);
   the request names the holder, and the chosen replica pulls the prefix from it (a
   migration) instead of recomputing it;
3. among replicas as free as each other (within one request's cells), power of two
   choices on queue length (Serve probes the two and takes the shorter queue).

A request that names a replica (`pin`: `x-strata-replica`, or a migration's export)
goes only there. Requests without a prompt (GET /v1/models, /health) take power of two.
"""

from __future__ import annotations

import random
import time
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from strata.cluster.keys import DEFAULT_ROUTE_BLOCK, matched_tokens

RESERVE_S = 30.0


class StrataRouter(RequestRouter):
    def initialize_state(self, imbalance: int = 2, policy: str = "strata", block: int = DEFAULT_ROUTE_BLOCK) -> None:
        """`policy`: "strata" (the rule above) or "round_robin" (benchmarks' baseline)."""
        if policy not in ("strata", "round_robin"):
            raise ValueError(f"unknown routing policy {policy!r}")
        self.imbalance = imbalance
        self.block = block  # tokens per prefix key (the front door's and the replicas')
        self.policy = policy
        self._held: dict[ReplicaID, tuple[Any, frozenset[int]]] = {}  # replica -> (seq, keys)
        self._routed_cells: dict[ReplicaID, tuple[Any, int]] = {}  # replica -> (seq, cells sent since)
        self._routed_keys: dict[ReplicaID, tuple[Any, set[int]]] = {}  # replica -> (seq, prompt keys sent since)
        self._next = 0
        self._reserved: dict[str, tuple[ReplicaID, float]] = {}  # request -> (replica chosen, when), not yet routed

    # ---- what each replica reported ---------------------------------------------------------
    def _stats(self, r: RunningReplica) -> dict:
        return r.routing_stats or {}

    def _keys(self, r: RunningReplica) -> tuple[frozenset[int], set[int]]:
        """The prefix keys the replica last reported, and those of prompts routed to it since
        (a conversation's next turn finds its replica before the next report)."""
        s = self._stats(r)
        seq = s.get("seq")
        cached = self._held.get(r.replica_id)
        if cached is None or cached[0] != seq:
            cached = (seq, frozenset(s.get("keys", ())))
            self._held[r.replica_id] = cached
        routed_seq, routed = self._routed_keys.get(r.replica_id, (None, set()))
        return cached[1], (routed if routed_seq == seq else set())

    def _matched(self, req: Any, r: RunningReplica) -> int:
        """Prompt tokens `r` can reuse: the request's leading keys it holds (keys.py)."""
        return matched_tokens(req.prefix_keys, self.block, *self._keys(r))

    def _load(self, r: RunningReplica) -> int:
        """Ongoing requests: Serve's probed count, else the last report; plus those chosen for
        it and not yet routed."""
        queued = self.replica_queue_len_cache.get(r.replica_id)
        if queued is None:
            s = self._stats(r)
            queued = s.get("running", 0) + s.get("waiting", 0)
        return queued + self._num_reserved(r.replica_id)

    def _free(self, r: RunningReplica) -> int:
        """Free cells as last reported, less what was routed there since."""
        s = self._stats(r)
        seq, sent = self._routed_cells.get(r.replica_id, (None, 0))
        return s.get("free_cells", 0) - (sent if seq == s.get("seq") else 0)

    def _admits(self, r: RunningReplica, cells: int) -> bool:
        s = self._stats(r)
        return self._free(r) + s.get("evictable_cells", 0) >= cells

    def _overloaded(self, r: RunningReplica, least: int) -> bool:
        load = self._load(r)
        return load >= self._stats(r).get("lanes", 1) and load - least >= self.imbalance

    # ---- Serve's hooks --------------------------------------------------------------------
    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is not None:
            # Every rank here is drawn from all replicas: when none of them takes the request,
            # Serve must back off before asking again (without this it asks again at once,
            # never yielding its event loop).
            pending_request.routing_context.should_backoff = True
        if not candidate_replicas:
            return []
        req = pending_request.args[0] if pending_request is not None and pending_request.args else None
        pin = getattr(req, "pin", None)
        if pin is not None:
            if hasattr(req, "route"):
                req.route = "pin"
            return [[r for r in candidate_replicas if r.replica_id.unique_id == pin]]
        if self.policy == "round_robin":
            self._next += 1
            ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
            return [[ordered[self._next % len(ordered)]], ordered]
        keys = getattr(req, "prefix_keys", None)
        if not keys:
            if hasattr(req, "route"):
                req.route = "pow2"
            return [self._two(candidate_replicas)]
        ranks = self._by_prefix(req, candidate_replicas)
        if len(ranks[0]) == 1 and pending_request is not None:
            self._reserve(pending_request, ranks[0][0].replica_id)
        return ranks

    def _reserve(self, pending_request: PendingRequest, replica_id: ReplicaID) -> None:
        """Counts a request chosen for one replica in that replica's load until it is routed
        (requests routed at once are all chosen before any reaches a replica's queue). A
        reservation whose request never got routed (cancelled) lapses after RESERVE_S."""
        now = time.monotonic()
        self._reserved = {k: v for k, v in self._reserved.items() if now - v[1] < RESERVE_S}
        self._reserved[pending_request.metadata.internal_request_id] = (replica_id, now)

    def _num_reserved(self, replica_id: ReplicaID) -> int:
        now = time.monotonic()
        return sum(1 for r, t in self._reserved.values() if r == replica_id and now - t < RESERVE_S)

    def _by_prefix(self, req: Any, replicas: list[RunningReplica]) -> list[list[RunningReplica]]:
        matched = {r.replica_id: self._matched(req, r) for r in replicas}
        least = min(self._load(r) for r in replicas)
        holder = max(replicas, key=lambda r: (matched[r.replica_id], -self._load(r)))
        m = matched[holder.replica_id]
        if m > 0:
            req.holder, req.holder_tokens = holder.replica_id.unique_id, m
            if self._admits(holder, req.num_new_cells - m) and not self._overloaded(holder, least):
                req.route = "prefix"
                return [[holder], self._two(replicas)]
        # Most free cells, spread: requests routed since a replica's report count against it.
        room = [r for r in replicas if not self._overloaded(r, least)] or replicas
        most = max(self._free(r) for r in room)
        best = [r for r in room if most - self._free(r) < max(req.num_new_cells, 1)]
        req.route = "free_cells"
        return [self._two(best), self._two(replicas)]

    def _two(self, replicas: list[RunningReplica]) -> list[RunningReplica]:
        """Two at random (Serve probes both and takes the shorter queue; on equal queues the
        first, so the order is random too)."""
        return random.sample(replicas, min(2, len(replicas)))

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        self._reserved.pop(pending_request.metadata.internal_request_id, None)  # now in Serve's count
        req = pending_request.args[0] if pending_request.args else None
        replica = self.curr_replicas.get(replica_id)
        if hasattr(req, "report_seq"):  # which report the routing saw (the front door's x-strata-router-seq)
            req.report_seq = (replica.routing_stats or {}).get("seq") if replica is not None else None
        cells = getattr(req, "num_new_cells", 0) - (
            getattr(req, "holder_tokens", 0) if getattr(req, "holder", None) == replica_id.unique_id else 0)
        if cells <= 0:
            return
        seq = (replica.routing_stats or {}).get("seq") if replica is not None else None
        old_seq, sent = self._routed_cells.get(replica_id, (None, 0))
        self._routed_cells[replica_id] = (seq, (sent if old_seq == seq else 0) + cells)
        keys_seq, keys = self._routed_keys.get(replica_id, (None, set()))
        if keys_seq != seq:
            keys = set()
        keys.update(getattr(req, "prefix_keys", ()))
        self._routed_keys[replica_id] = (seq, keys)
