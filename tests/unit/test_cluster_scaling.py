"""The cluster's autoscaling policy: Serve's queue rule, plus one replica when pools fill."""

from __future__ import annotations

import pytest

from tests.conftest import require

require("ray.serve")

from ray.serve.config import AutoscalingConfig, AutoscalingContext  # noqa: E402

from strata.cluster.scaling import OCCUPANCY, queue_and_pool_policy  # noqa: E402


def context(num_requests: float, occupancy: list[float], replicas: int = 2) -> AutoscalingContext:
    ids = [f"r{i}" for i in range(replicas)]
    return AutoscalingContext(
        deployment_id=None, deployment_name="strata-replica", app_name="strata", current_num_replicas=replicas,
        target_num_replicas=replicas, running_replicas=ids, total_num_requests=num_requests,
        total_queued_requests=0, aggregated_metrics={OCCUPANCY: dict(zip(ids, occupancy))}, raw_metrics={},
        capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=8, policy_state={},
        last_scale_up_time=None, last_scale_down_time=None, current_time=0.0,
        config=AutoscalingConfig(min_replicas=1, max_replicas=8, target_ongoing_requests=3))


@pytest.mark.parametrize(("requests", "occupancy", "wanted"), [
    (6, [0.2, 0.3], 2),  # 3 per replica: as targeted
    (12, [0.2, 0.3], 4),  # queues twice the target: twice the replicas
    (2, [0.95, 0.9], 3),  # short queues, full pools: one more
    (12, [0.95, 0.9], 4),  # the queue rule already asks for more
    (1, [0.1, 0.0], 1 / 3),  # idle: fewer (Serve's bounds and delays apply around the policy)
])
def test_queue_rule_and_full_pools(requests, occupancy, wanted):
    desired, _ = queue_and_pool_policy(context(requests, occupancy))
    assert desired == pytest.approx(wanted)
