"""Ray Serve's own prefix-cache-affinity router as a cluster policy ("ray_prefix"), a
baseline for benchmarks/cluster.py.

Ray's `PrefixCacheAffinityRouter` (ray.serve.llm) keeps a tree of the prompt texts it has
routed to each replica (not what the replicas hold) and sends a request to the replica
whose texts share the longest prefix with its prompt while queues are balanced; below a
10 % match, to the replica with the fewest characters routed so far. It reads the text
from the request's `prompt` attribute (the front door fills it for this policy only).
What it cannot route is handled here first: a pinned request goes to its replica, one
without a prompt (GET /v1/models, /health) takes power of two choices.

The public class is a plain subclass of the internal one, and its package imports pyarrow
(ray[llm]); without it the internal class, the same code, is used.
"""

from __future__ import annotations

from typing import Any

from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, ReplicaID, RunningReplica

try:
    from ray.serve.llm.request_router import PrefixCacheAffinityRouter
except ImportError:  # ray.serve.llm needs pyarrow (ray[llm]); the router itself does not
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
        PrefixCacheAffinityRouter,
    )


def _request(pending_request: PendingRequest | None) -> Any:
    return pending_request.args[0] if pending_request is not None and pending_request.args else None


class RayPrefixRouter(PrefixCacheAffinityRouter):
    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        req = _request(pending_request)
        pin = getattr(req, "pin", None)
        if pin is not None:
            req.route = "pin"
            pending_request.routing_context.should_backoff = True  # see StrataRouter.choose_replicas
            return [[r for r in candidate_replicas if r.replica_id.unique_id == pin]]
        if not getattr(req, "prompt", None):  # Ray's router needs text (it divides by its length)
            if hasattr(req, "route"):
                req.route = "pow2"
            return await PowerOfTwoChoicesRequestRouter.choose_replicas(self, candidate_replicas, pending_request)
        return await super().choose_replicas(candidate_replicas, pending_request)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        if getattr(_request(pending_request), "prompt", None):
            super().on_request_routed(pending_request, replica_id, result)
