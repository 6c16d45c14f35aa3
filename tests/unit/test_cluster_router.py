"""StrataRouter's decisions from replicas' routing stats (no Ray cluster: fake replicas).

The rule (router.py): the longest cached prefix's holder unless it is overloaded or
cannot admit the turn; then the most free cells, counting what was routed since each
replica's report; ties to power of two. Also: a pin goes only to its replica, and a burst
of new conversations spreads.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from tests.conftest import require

require("ray.serve")

from strata.cluster.forward import ForwardedRequest  # noqa: E402
from strata.cluster.keys import prefix_keys  # noqa: E402
from strata.cluster.router import StrataRouter  # noqa: E402

BLOCK = 4


@dataclass(frozen=True)
class FakeId:
    unique_id: str


@dataclass
class FakeReplica:
    replica_id: FakeId
    routing_stats: dict = field(default_factory=dict)


class FakeQueues(dict):
    pass


def make_router(queues: dict[str, int] | None = None) -> StrataRouter:
    router = StrataRouter.__new__(StrataRouter)  # Serve's constructor needs a deployment
    router.initialize_state(imbalance=2, block=BLOCK)
    router._replica_queue_len_cache = FakeQueues({FakeId(k): v for k, v in (queues or {}).items()})
    router._replicas = {}
    return router


def replica(name: str, held: list[list[int]] = (), free: int = 1000, evictable: int = 0, lanes: int = 3,
            seq: int = 1) -> FakeReplica:
    keys = sorted({k for tokens in held for k in prefix_keys(tokens, BLOCK)})
    return FakeReplica(FakeId(name), {"replica": name, "ready": True, "seq": seq, "block": BLOCK, "keys": keys,
                                      "free_cells": free, "evictable_cells": evictable, "lanes": lanes,
                                      "running": 0, "waiting": 0})


def request(tokens: list[int], max_tokens: int = 8) -> ForwardedRequest:
    return ForwardedRequest("POST", "/v1/completions", b"", [], b"", prompt_ids=tokens,
                            prefix_keys=prefix_keys(tokens, BLOCK), num_new_cells=len(tokens) + max_tokens + 1)


class Pending:
    def __init__(self, req):
        self.args = [req]
        self.routing_context = SimpleNamespace(should_backoff=False)
        self.metadata = SimpleNamespace(internal_request_id=str(id(req)))  # one id per request


def choose(router, replicas, req):
    return asyncio.run(router.choose_replicas(replicas, Pending(req)))


CONV = list(range(100, 120))  # 5 blocks


def test_the_holder_of_the_longest_prefix_wins():
    a, b, c = replica("a", [CONV[:8]]), replica("b", [CONV[:16]]), replica("c", free=5000)
    req = request(CONV + [7, 8])
    ranks = choose(make_router(), [a, b, c], req)
    assert [r.replica_id.unique_id for r in ranks[0]] == ["b"]
    assert (req.route, req.holder, req.holder_tokens) == ("prefix", "b", 16)


def test_a_holder_that_cannot_admit_names_itself_for_a_migration():
    a = replica("a", [CONV], free=10, evictable=10)  # the turn adds 23 - 20 + ... cells: too many
    b = replica("b", free=900)
    c = replica("c", free=100)
    req = request(CONV + list(range(50)), max_tokens=40)
    ranks = choose(make_router(), [a, b, c], req)
    assert [r.replica_id.unique_id for r in ranks[0]] == ["b"]
    assert (req.route, req.holder, req.holder_tokens) == ("free_cells", "a", 20)


def test_an_overloaded_holder_gives_way():
    a, b = replica("a", [CONV]), replica("b")
    req = request(CONV + [1, 2])
    ranks = choose(make_router({"a": 3, "b": 0}), [a, b], req)  # a's 3 lanes busy, b idle
    assert [r.replica_id.unique_id for r in ranks[0]] == ["b"] and req.holder == "a"
    req = request(CONV + [1, 2])
    ranks = choose(make_router({"a": 3, "b": 2}), [a, b], req)  # busy, but so is b: stay
    assert [r.replica_id.unique_id for r in ranks[0]] == ["a"] and req.route == "prefix"


def test_a_burst_of_new_conversations_spreads():
    """Stats do not change during the burst; what was routed since counts against a replica."""
    router = make_router()
    replicas = [replica("a", free=400), replica("b", free=400)]
    router._replicas = {r.replica_id: r for r in replicas}
    served = []
    for i in range(8):
        req = request(list(range(1000 * i, 1000 * i + 30)), max_tokens=20)
        ranks = choose(router, replicas, req)
        # Serve probes the first rank's replicas and takes the shorter queue: all queues are
        # equal here, so take the first.
        chosen = ranks[0][0]
        router.on_request_routed(Pending(req), chosen.replica_id, None)
        served.append(chosen.replica_id.unique_id)
    assert served.count("a") == served.count("b") == 4


def test_requests_chosen_at_once_count_in_the_holders_load():
    """Eight follow-ups chosen before any is routed: the holder (3 lanes) takes them until its
    chosen-but-not-routed ones exceed the idle replica's load by the imbalance."""
    router = make_router({"a": 0, "b": 0})
    a, b = replica("a", [CONV]), replica("b")
    firsts, reqs = [], []
    for _ in range(8):
        reqs.append(request(CONV + [1, 2]))  # held: a request's id is its routing id here
        ranks = choose(router, [a, b], reqs[-1])
        firsts.append(ranks[0][0].replica_id.unique_id if len(ranks[0]) == 1 else "pow2")
    assert firsts[:3] == ["a", "a", "a"] and "a" in firsts and firsts.count("a") < 8


def test_a_turn_finds_its_replica_before_the_next_report():
    """A first turn is routed (no replica reported its keys yet); its follow-up goes to the
    same replica, from the keys the router saw go there."""
    router = make_router()
    replicas = [replica("a"), replica("b")]
    router._replicas = {r.replica_id: r for r in replicas}
    first = request(CONV)
    chosen = choose(router, replicas, first)[0][0]
    router.on_request_routed(Pending(first), chosen.replica_id, None)
    follow = request(CONV + [5, 6, 7, 8, 9])
    ranks = choose(router, replicas, follow)
    assert ranks[0] == [chosen] and follow.route == "prefix" and follow.holder_tokens == 20


def test_a_pin_goes_only_to_its_replica():
    a, b = replica("a", [CONV]), replica("b")
    req = request(CONV)
    req.pin = "b"
    ranks = choose(make_router(), [a, b], req)
    assert ranks == [[b]] and req.route == "pin"


def test_no_prompt_is_power_of_two():
    replicas = [replica(n) for n in "abc"]
    req = ForwardedRequest("GET", "/v1/models", b"", [], b"")
    ranks = choose(make_router(), replicas, req)
    assert len(ranks) == 1 and len(ranks[0]) == 2 and req.route == "pow2"


def test_round_robin_cycles():
    router = StrataRouter.__new__(StrataRouter)
    router.initialize_state(policy="round_robin", block=BLOCK)
    replicas = [replica(n) for n in "abc"]
    firsts = [choose(router, replicas, request(CONV))[0][0].replica_id.unique_id for _ in range(6)]
    assert firsts == ["b", "c", "a", "b", "c", "a"]
