"""The cluster as one Ray Serve application: a front door bound to N strata replicas."""

from __future__ import annotations

from dataclasses import dataclass

from strata.cluster.keys import DEFAULT_ROUTE_BLOCK
from strata.config import EngineConfig
from strata.errors import ConfigError
from strata.server.settings import ServerSettings

REPLICA_DEPLOYMENT = "strata-replica"
FRONT_DEPLOYMENT = "strata-front"


def replica_ids(app_name: str, deployment: str = REPLICA_DEPLOYMENT) -> list[str]:
    """The ids of a deployment's running replicas (what `x-strata-replica` names), from the
    names Serve gives their Ray actors. A GCS call: blocking."""
    import ray

    prefix = f"SERVE_REPLICA::{app_name}#{deployment}#"
    return sorted(a["name"][len(prefix):] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"].startswith(prefix))
POLICIES = ("strata", "round_robin", "ray_prefix")


@dataclass(frozen=True)
class ClusterSpec:
    config: EngineConfig
    settings: ServerSettings
    model_id: str
    replicas: int = 2
    max_replicas: int | None = None  # above `replicas`: Serve autoscales between the two
    replica_cpus: float = 1.0
    block: int = DEFAULT_ROUTE_BLOCK  # tokens per prefix key
    policy: str = "strata"  # or "round_robin" / "ray_prefix" (Ray's PrefixCacheAffinityRouter): baselines
    imbalance: int = 2  # queue difference at which the prefix holder counts as overloaded
    stats_period_s: float = 0.5  # how often replicas report (free cells, queue, prefix keys)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"--replicas must be at least 1, got {self.replicas}")
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise ConfigError(f"--max-replicas {self.max_replicas} is below --replicas {self.replicas}")
        if not self.replica_cpus >= 0:
            raise ConfigError(f"--replica-cpus must be at least 0, got {self.replica_cpus}")
        if self.block < 1:
            raise ConfigError(f"--route-block must be positive, got {self.block}")
        if self.policy not in POLICIES:
            raise ConfigError(f"--route-policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")


def build_app(spec: ClusterSpec):
    """The Serve application (`serve.run(build_app(spec))`)."""
    from ray import serve
    from ray.serve.config import AutoscalingConfig, AutoscalingPolicy, RequestRouterConfig

    from strata.cluster.front import FrontDoor
    from strata.cluster.replica import StrataReplica
    from strata.cluster.router import StrataRouter
    from strata.cluster.scaling import queue_and_pool_policy

    if spec.policy == "ray_prefix":
        from strata.cluster.ray_prefix import RayPrefixRouter

        router, router_kwargs = RayPrefixRouter, {}
    else:
        router, router_kwargs = StrataRouter, {"imbalance": spec.imbalance, "policy": spec.policy, "block": spec.block}
    lanes = spec.config.num_lanes
    scale: dict = {"num_replicas": spec.replicas}
    if spec.max_replicas is not None and spec.max_replicas > spec.replicas:
        # Out when requests wait for lanes or pools fill with running requests; in when idle.
        scale = {"autoscaling_config": AutoscalingConfig(
            min_replicas=spec.replicas, max_replicas=spec.max_replicas, target_ongoing_requests=lanes,
            policy=AutoscalingPolicy(policy_function=queue_and_pool_policy))}
    replica = serve.deployment(
        StrataReplica,
        name=REPLICA_DEPLOYMENT,
        max_ongoing_requests=lanes + spec.settings.max_waiting + 4,  # the app's own queue answers 503 beyond
        ray_actor_options={"num_cpus": spec.replica_cpus},
        health_check_period_s=2,
        request_router_config=RequestRouterConfig(
            request_router_class=router,
            request_router_kwargs=router_kwargs,
            request_routing_stats_period_s=spec.stats_period_s,
            request_routing_stats_timeout_s=max(5.0, 4 * spec.stats_period_s),
        ),
        **scale,
    )
    front = serve.deployment(FrontDoor, name=FRONT_DEPLOYMENT, num_replicas=1, max_ongoing_requests=10_000,
                             ray_actor_options={"num_cpus": 0})
    return front.bind(replica.bind(spec.config, spec.settings, spec.model_id, spec.block), spec.config.model,
                      spec.model_id, spec.block, spec.settings.api_key, spec.settings.max_body_bytes,
                      spec.policy == "ray_prefix")
