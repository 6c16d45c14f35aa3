"""One arm's cluster: Ray started once in this process (a local cluster of its own, so a
Ray another process runs is left alone), Serve's HTTP proxy on `port`, and per arm a fresh
application `serve.run(build_app(spec))`, deleted after the arm (its replicas and their K/V
go with it, so every arm starts cold)."""

from __future__ import annotations

import argparse
import time

APP = "strata-bench"
TREE_ACTOR = "LlmPrefixTreeActor"  # Ray's PrefixCacheAffinityRouter's tree (prefix_aware_router.py)


def cluster_spec(policy: str, a: argparse.Namespace):
    """The spec `strata cluster` builds from these flags (its own parser, so defaults match)."""
    from strata.cli import build_parser
    from strata.cluster.app import ClusterSpec
    from strata.engine_args import engine_config
    from strata.server.cli import server_settings
    from strata.server.settings import model_id

    argv = ["cluster", "--replicas", str(a.replicas), "--threads", str(a.threads), "--port", str(a.port),
            "--max-context", str(a.max_context), "--kv-chunk", str(a.kv_chunk), "--kv-pool-tokens", str(a.pool),
            "--route-policy", policy, "--dtype", a.dtype]
    if a.model:
        argv += ["--model", a.model]
    args = build_parser().parse_args(argv)
    config, settings = engine_config(args), server_settings(args, {})
    return ClusterSpec(config, settings, model_id(config.model, settings.model_alias), args.replicas,
                       policy=args.route_policy)


class Cluster:
    def __init__(self, port: int, num_cpus: int):
        import ray
        from ray import serve

        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        self.url = f"http://127.0.0.1:{port}"

    def deploy(self, spec) -> float:
        """Runs the arm's application; returns the seconds until Serve called it healthy."""
        from ray import serve

        from strata.cluster.app import build_app

        t = time.perf_counter()
        serve.run(build_app(spec), name=APP, route_prefix="/")
        return time.perf_counter() - t

    def replica_ids(self) -> list[str]:
        """The strata replicas' ids (what `x-strata-replica` names), from Serve's actor names."""
        from strata.cluster.app import replica_ids

        return replica_ids(APP)

    def remove(self) -> None:
        """Deletes the application, and Ray's prefix tree (a detached actor that outlives the
        app and would hand the next ray_prefix arm the ids of replicas that are gone)."""
        import ray
        from ray import serve

        from strata.cluster.app import REPLICA_DEPLOYMENT

        serve.delete(APP)
        try:
            ray.kill(ray.get_actor(TREE_ACTOR, namespace=f"serve::{APP}::{REPLICA_DEPLOYMENT}"))
        except ValueError:  # not a ray_prefix arm
            pass

    def close(self) -> None:
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()
