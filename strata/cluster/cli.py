"""`strata cluster`: strata replicas on Ray Serve behind one OpenAI-compatible front door."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from strata.cluster.app import POLICIES
from strata.cluster.keys import DEFAULT_ROUTE_BLOCK
from strata.engine_args import add_engine_args, engine_config
from strata.server.cli import (
    SERVE_DEFAULT_BATCH,
    SERVE_DEFAULT_PREFILL_ALONE,
    add_server_args,
    serve_default_prefill_chunk,
    server_settings,
)
from strata.server.settings import model_id


def add_cluster_parser(subparsers: argparse._SubParsersAction) -> None:
    c = subparsers.add_parser("cluster", help="serve with several strata replicas on Ray Serve")
    g = c.add_argument_group("cluster")
    g.add_argument("--replicas", type=int, default=2, help="strata engines (Serve replicas) to run (default 2)")
    g.add_argument("--max-replicas", type=int, default=None,
                   help="autoscale between --replicas and this many on queued requests")
    g.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="a running Ray cluster to join (ray://host:port or auto); default: start one here")
    g.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs Ray reserves per replica (default 1)")
    g.add_argument("--route-block", type=int, default=DEFAULT_ROUTE_BLOCK,
                   help=f"tokens per prefix key the router matches (default {DEFAULT_ROUTE_BLOCK})")
    g.add_argument("--route-policy", choices=POLICIES, default="strata",
                   help="strata: by cached prefix, free K/V, then load (default); round_robin, ray_prefix "
                        "(Ray Serve's PrefixCacheAffinityRouter): baselines")
    add_server_args(c)
    add_engine_args(c, default_batch=SERVE_DEFAULT_BATCH, default_prefill_chunk=serve_default_prefill_chunk(),
                    default_prefill_alone=SERVE_DEFAULT_PREFILL_ALONE)
    c.set_defaults(func=cmd_cluster)


def cmd_cluster(args: argparse.Namespace) -> int:
    from strata.cluster.app import ClusterSpec, build_app

    config = engine_config(args)  # bad flags fail before Ray starts
    settings = server_settings(args, os.environ)
    spec = ClusterSpec(config, settings, model_id(config.model, settings.model_alias), args.replicas,
                       args.max_replicas, args.replica_cpus, args.route_block, args.route_policy)
    try:
        import ray
        from ray import serve
    except ImportError:
        print("strata: error: strata cluster needs Ray Serve: pip install 'strata[cluster]'", file=sys.stderr)
        return 2
    ray.init(address=args.ray, include_dashboard=False, logging_level="WARNING")
    # SIGTERM (a supervisor's stop) ends the run as Ctrl-C does, but with status 0: either way
    # Serve and the Ray processes this command started are shut down, not left running.
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        serve.start(http_options={"host": settings.host, "port": settings.port})
        print(f"strata: cluster of {spec.replicas} replicas serving {spec.model_id} at "
              f"http://{settings.host}:{settings.port}/v1", file=sys.stderr)
        serve.run(build_app(spec), name="strata", route_prefix="/", blocking=True)
    except Stopped:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        serve.shutdown()
        ray.shutdown()
    print("strata: cluster stopped", file=sys.stderr)
    return 0


class Stopped(Exception):
    """SIGTERM arrived."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped
