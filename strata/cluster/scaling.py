"""Serve's autoscaling for strata replicas: on queued requests and on pool occupancy.

Each replica reports `pool_occupancy` (`StrataReplica.record_autoscaling_stats`): the
share of its pool's chunks held by running requests (parked conversations do not count:
they give way to new requests). The policy takes Serve's queue-length rule (ongoing
requests over `target_ongoing_requests` per replica) and asks for one replica more when
the replicas' mean occupancy is above `HIGH`, however short their queues: long
conversations fill a pool before they fill its lanes. Serve applies --replicas and
--max-replicas as bounds, and its up/down-scaling delays, around this function.
"""

from __future__ import annotations

from typing import Any

from ray.serve.autoscaling_policy import replica_queue_length_autoscaling_policy
from ray.serve.config import AutoscalingContext

OCCUPANCY = "pool_occupancy"
HIGH = 0.85  # mean occupancy above which one more replica is wanted


def queue_and_pool_policy(ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
    desired, state = replica_queue_length_autoscaling_policy(ctx)
    per_replica = (ctx.aggregated_metrics or {}).get(OCCUPANCY, {})
    if per_replica and ctx.current_num_replicas > 0:
        mean = sum(per_replica.values()) / len(per_replica)
        if mean > HIGH:
            desired = max(desired, ctx.current_num_replicas + 1)
    return desired, state
