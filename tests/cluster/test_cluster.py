"""`strata cluster` end to end: a local Ray cluster of two logical nodes on loopback, two
strata replicas of a tiny float32 model with one thread each, the real `openai` client.

A follow-up goes to the replica holding its conversation and reports `cached_tokens`;
when that replica is overloaded the turn goes elsewhere and pulls the conversation's K/V
from it (a migration), with the same greedy output as the turn run where it was; a burst
of new conversations spreads over both replicas; requests the front door cannot read are
answered by a replica exactly as by `strata serve`; a turn whose holder cannot export (its
process stopped) is computed where it went, with the model's own answer; a replica killed
before its answer starts is a 503 `replica_failed` that the openai client retries; a replica
killed mid-stream ends only its own stream, with a retryable error.

Replicas report to the router every 0.5 s. Where a test needs the router to know a turn, it
waits for that event: an answer says how many reports its replica had made
(`x-strata-report-seq`), every answer through the front door says which report of its
replica the router routed by (`x-strata-router-seq`), and the test polls a pinned GET until
the router routes by a report made after the turn.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.conftest import require  # noqa: E402
from tests.ports import held_port  # noqa: E402

ray = require("ray")
serve = require("ray.serve")
openai = require("openai")

from strata.cluster.app import REPLICA_DEPLOYMENT, ClusterSpec, build_app, replica_ids  # noqa: E402
from strata.config import EngineConfig  # noqa: E402
from strata.server.settings import ServerSettings  # noqa: E402

MODEL = "tiny"
LANES = 3  # --batch 2
BODY_LIMIT = 64 * 1024


@dataclass
class Cluster:
    base_url: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def cluster(tiny_llama_dir) -> Iterator[Cluster]:
    from ray.cluster_utils import Cluster as RayCluster

    nodes = RayCluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    nodes.add_node(num_cpus=2)
    ray.init(address=nodes.address, log_to_driver=False)
    config = EngineConfig(model=tiny_llama_dir, dtype="float32", max_context=512, batch=LANES - 1, kv_chunk=16,
                          kv_pool_tokens=2048, threads=1, prefill_chunk=64)
    with held_port() as port:  # held while the cluster runs: Serve's proxy binds it beside this socket
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        spec = ClusterSpec(config, ServerSettings(model_alias=MODEL, port=port, max_body_bytes=BODY_LIMIT), MODEL,
                           replicas=2, replica_cpus=1)
        serve.run(build_app(spec), name="strata", route_prefix="/")
        try:
            yield Cluster(f"http://127.0.0.1:{port}")
        finally:
            serve.shutdown()
            ray.shutdown()
            nodes.shutdown()


def routed_by(c: Cluster, replica: str, seq: int, timeout: float = 120.0) -> None:
    """Until the router routes by a report of `replica` numbered `seq` or later."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{c.base_url}/v1/models", headers={"x-strata-replica": replica}, timeout=30)
        if r.status_code == 200 and int(r.headers.get("x-strata-router-seq", -1)) >= seq:
            return
        assert time.monotonic() < deadline, f"the router never saw report {seq} of {replica}: {r.headers}"
        time.sleep(0.05)


def known(c: Cluster, headers) -> None:
    """Until the router knows the turn answered with `headers`: a report its replica began
    after answering (one may have been under way then) is two past the count it answered with."""
    routed_by(c, headers["x-strata-replica"], int(headers["x-strata-report-seq"]) + 2)


@pytest.fixture(scope="module")
def offline(tiny_llama_dir):
    """The turn's greedy answer from the model itself, offline (float32: exact)."""
    from strata import LLM, SamplingParams

    llm = LLM(model=tiny_llama_dir, dtype="float32", max_context=512, batch=0)
    return lambda messages: llm.chat(messages, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].text


def chat(c: Cluster, messages: list[dict], max_tokens: int = 12, **headers) -> tuple[str, dict, object]:
    raw = c.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0, extra_headers=headers or None,
        extra_body={"ignore_eos": True})
    done = raw.parse()
    return done.choices[0].message.content, raw.headers, done.usage


SYSTEM = "You are a careful assistant who answers in full sentences. " * 6


def test_a_follow_up_goes_to_its_owner_and_reports_cached_tokens(cluster):
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name three rivers."}]
    text, headers, usage = chat(cluster, first)
    owner = headers["x-strata-replica"]
    known(cluster, headers)
    follow = first + [{"role": "assistant", "content": text}, {"role": "user", "content": "And three lakes?"}]
    _, headers, usage = chat(cluster, follow)
    assert headers["x-strata-replica"] == owner and headers["x-strata-route"] == "prefix"
    assert usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens - 32


def _block(c: Cluster, replica: str, start: int, decoding: threading.Event | None = None,
           starts: list | None = None) -> bytes:
    """A long greedy stream pinned to `replica` (it holds a lane while it runs); `decoding`
    is set once its first token has arrived; its answer's headers go to `starts`."""
    body = {"model": MODEL, "prompt": list(range(start, start + 10)), "max_tokens": 480, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{c.base_url}/v1/completions", json=body, headers={"x-strata-replica": replica},
                      timeout=300) as r:
        assert r.status_code == 200 and r.headers["x-strata-replica"] == replica
        if starts is not None:
            starts.append(r.headers)
        got = b""
        for piece in r.iter_bytes():
            got += piece
            if decoding is not None and b"data: " in got:
                decoding.set()
        return got


def test_an_overloaded_owner_hands_its_conversation_over(cluster):
    first = [{"role": "user", "content": "Tell me about the sea and the ships that sail on it. " * 4}]
    text, headers, _ = chat(cluster, first)
    owner = headers["x-strata-replica"]
    follow = first + [{"role": "assistant", "content": text}, {"role": "user", "content": "More, please."}]
    known(cluster, headers)
    with concurrent.futures.ThreadPoolExecutor(LANES) as pool:
        decoding = [threading.Event() for _ in range(LANES)]
        blockers = [pool.submit(_block, cluster, owner, 1000 + 100 * i, decoding[i]) for i in range(LANES)]
        assert all(d.wait(120) for d in decoding)  # every lane of the owner decodes a long stream
        migrated_text, headers, usage = chat(cluster, follow)
        for b in blockers:
            b.result()
    target = headers["x-strata-replica"]
    assert target != owner and headers["x-strata-route"] == "free_cells"
    moved = int(headers["x-strata-migrated-tokens"])
    assert moved > 0 and usage.prompt_tokens_details.cached_tokens >= moved - 1
    unmigrated_text, headers, _ = chat(cluster, follow, **{"x-strata-replica": owner})
    assert headers["x-strata-replica"] == owner
    assert migrated_text == unmigrated_text
    metrics = httpx.get(f"{cluster.base_url}/metrics", timeout=60).text
    assert "strata_cluster_migrations_total 1.0" in metrics
    for replica in (owner, target):  # each replica's own metrics (strata serve's names), labelled
        assert f'strata_kv_chunk_cells{{replica="{replica}"}} 16.0' in metrics


def test_a_burst_of_new_conversations_spreads(cluster):
    prompts = [f"Conversation {i}: " + "tell me a story about a number " * 8 + str(i) for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        served = list(pool.map(lambda p: chat(cluster, [{"role": "user", "content": p}], 4)[1]["x-strata-replica"],
                               prompts))
    assert len(set(served)) == 2, served


def test_a_shared_prefix_does_not_pile_every_conversation_on_its_holder(cluster):
    """Skew: every new conversation starts with the same long system prompt, which one
    replica holds. Affinity sends them there until its lanes are full and its queue runs
    ahead; the rest go to the other replica, which pulls the prefix instead of computing it."""
    system = "You answer questions about the weather on distant planets, briefly. " * 5
    _, headers, _ = chat(cluster, [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}], 2)
    holder = headers["x-strata-replica"]
    known(cluster, headers)

    def conversation(i: int) -> tuple[str, int, int]:
        _, h, usage = chat(cluster, [{"role": "system", "content": system},
                                     {"role": "user", "content": f"What about planet {i}?"}], 200)
        return h["x-strata-replica"], int(h.get("x-strata-migrated-tokens", 0)), usage.prompt_tokens_details.cached_tokens

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        served = list(pool.map(conversation, range(8)))
    elsewhere = [s for s in served if s[0] != holder]
    assert 1 <= len(elsewhere) <= 6, served
    assert any(moved > 0 for _, moved, _ in elsewhere), served  # the prefix came over, once at least
    assert all(cached > 0 for r, _, cached in served if r == holder), served


def test_the_front_door_answers_as_strata_serve(cluster):
    c = cluster.client()
    assert [m.id for m in c.models.list().data] == [MODEL]
    with pytest.raises(openai.BadRequestError) as err:
        c.completions.create(model=MODEL, prompt="hi", max_tokens=4, temperature=-1)
    assert err.value.body["param"] == "temperature" and "x-strata-replica" in err.value.response.headers
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="other", prompt="hi", max_tokens=4)
    big = httpx.post(f"{cluster.base_url}/v1/completions", content=b"x" * (BODY_LIMIT + 1),
                     headers={"content-type": "application/json"})
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    anthropic = require("anthropic")
    raw = anthropic.Anthropic(base_url=cluster.base_url, api_key="none", max_retries=0).messages.with_raw_response \
        .create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hello"}])
    assert "x-strata-replica" in raw.headers and 1 <= raw.parse().usage.output_tokens <= 5
    pieces = [ch.choices[0].text for ch in c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6,
                                                                  temperature=0, stream=True,
                                                                  extra_body={"ignore_eos": True})]
    whole = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0,
                                 extra_body={"ignore_eos": True}).choices[0].text
    assert "".join(pieces) == whole


UNIT_SCHEMA = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"],
               "additionalProperties": False}
PICK_UNIT = {"type": "function", "function": {"name": "pick_unit", "description": "Pick a unit",
                                              "parameters": UNIT_SCHEMA}}


def test_the_agents_api_through_the_front_door(cluster):
    """The agents' clients unchanged against the cluster: a parsed structured output, a forced
    tool call, n choices, and Responses API follow-ups by previous_response_id, each sent to the
    replica that holds its conversation (the response id names it) and served from its cache."""
    from typing import Literal

    from pydantic import BaseModel

    class Unit(BaseModel):
        unit: Literal["celsius", "fahrenheit"]

    c = cluster.client()
    ask = [{"role": "user", "content": "Pick a unit."}]
    parsed = c.chat.completions.parse(model=MODEL, messages=ask, response_format=Unit, temperature=0, max_tokens=32)
    assert isinstance(parsed.choices[0].message.parsed, Unit)
    called = c.chat.completions.create(model=MODEL, messages=ask, tools=[PICK_UNIT], tool_choice="required",
                                       parallel_tool_calls=False, temperature=0, max_tokens=256).choices[0]
    assert called.finish_reason == "tool_calls" and called.message.tool_calls[0].function.name == "pick_unit", called
    Unit.model_validate_json(called.message.tool_calls[0].function.arguments)
    choices = c.chat.completions.create(model=MODEL, messages=ask, n=2, seed=3, temperature=1.0, max_tokens=4)
    assert [choice.index for choice in choices.choices] == [0, 1]
    raw = c.responses.with_raw_response.create(model=MODEL, input="Name a fruit.", instructions=SYSTEM,
                                               temperature=0, max_output_tokens=4)
    previous, owner = raw.parse(), raw.headers["x-strata-replica"]
    assert previous.id.startswith(f"resp_{owner}_")
    for turn in range(4):  # by chance, each would find its replica one time in two
        raw = c.responses.with_raw_response.create(model=MODEL, input=f"And another, number {turn}?",
                                                   instructions=SYSTEM, previous_response_id=previous.id,
                                                   temperature=0, max_output_tokens=4)
        assert raw.headers["x-strata-replica"] == owner and raw.headers["x-strata-route"] == "pin", raw.headers
        follow = raw.parse()
        assert follow.usage.input_tokens_details.cached_tokens >= previous.usage.input_tokens - 16, follow.usage
        previous = follow


def two_replicas(c: Cluster, timeout: float = 300.0) -> list[str]:
    """The two replicas once both serve and the router has a report of each (after a kill:
    once Serve's replacement is up)."""
    deadline = time.monotonic() + timeout
    while True:
        ids = _replica_ids()
        if len(ids) == 2:
            try:
                for r in ids:
                    routed_by(c, r, 1, timeout=30)
                return ids
            except (AssertionError, httpx.HTTPError):
                pass
        assert time.monotonic() < deadline, f"two replicas never served: {ids}"
        time.sleep(0.2)


def _pid(replica: str) -> int:
    actor = ray.get_actor(_actor_name(replica), namespace="serve")
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


def _migrating(c: Cluster, replica: str) -> float:
    text = httpx.get(f"{c.base_url}/metrics", headers={"x-strata-replica": replica}, timeout=30).text
    found = re.search(r"^strata_migrations_in_progress (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


@contextlib.contextmanager
def busy_and_stopped(c: Cluster, holder: str, pool: concurrent.futures.Executor) -> Iterator[None]:
    """`holder` with every lane decoding a long stream, the router told so, then its process
    stopped (SIGSTOP) until the block ends (SIGCONT, unless it was killed meanwhile): the router
    passes it over (overloaded) and it answers nothing, so a turn it holds goes elsewhere and
    waits there for an export that cannot come."""
    decoding = [threading.Event() for _ in range(LANES)]
    starts: list[dict] = []
    blockers = [pool.submit(_block, c, holder, 5000 + 100 * i, decoding[i], starts) for i in range(LANES)]
    assert all(d.wait(120) for d in decoding)
    routed_by(c, holder, max(int(h["x-strata-report-seq"]) for h in starts) + 2)  # it reported them running
    pid = _pid(holder)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        for b in blockers:
            with contextlib.suppress(Exception):  # a killed holder ends its streams with an error event
                b.result()


def _a_turn_on(c: Cluster, holder: str, words: str) -> tuple[list[dict], str]:
    first = [{"role": "user", "content": words * 4}]
    text, headers, _ = chat(c, first, **{"x-strata-replica": holder})
    known(c, headers)
    return first + [{"role": "assistant", "content": text}, {"role": "user", "content": "And then?"}], text


def test_a_holder_that_cannot_export_leaves_the_turn_to_be_computed(cluster, offline):
    """The holder is stopped: the replica the turn went to waits EXPORT_TIMEOUT_S for its
    prefix, then computes the whole prompt; the answer is the one the model gives."""
    holder, other = two_replicas(cluster)
    follow, _ = _a_turn_on(cluster, holder, "Describe a lighthouse on a stormy night. ")
    with concurrent.futures.ThreadPoolExecutor(LANES) as pool, busy_and_stopped(cluster, holder, pool):
        text, headers, usage = chat(cluster, follow)
    assert headers["x-strata-replica"] == other and headers["x-strata-route"] == "free_cells"
    assert "x-strata-migrated-tokens" not in headers  # nothing came over: computed here
    assert usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens // 2
    assert text == offline(follow)


def test_a_replica_killed_before_its_answer_starts_is_a_503_the_client_retries(cluster, offline):
    """The turn waits on its replica (for a stopped holder's export) when that replica is killed:
    the front door answers 503 `replica_failed` with Retry-After, and the openai client's
    retry is served elsewhere. Kills a replica: Serve replaces it."""
    holder, victim = two_replicas(cluster)
    follow, _ = _a_turn_on(cluster, holder, "Tell me about the tides of the northern sea. ")
    seen: list[tuple[int, str]] = []
    client = openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key="none", max_retries=3, timeout=300,
                           http_client=httpx.Client(event_hooks={"response": [
                               lambda r: seen.append((r.status_code, r.read().decode(errors="replace")))]}))
    with concurrent.futures.ThreadPoolExecutor(LANES + 1) as pool:
        with busy_and_stopped(cluster, holder, pool):
            turn = pool.submit(client.chat.completions.create, model=MODEL, messages=follow, max_tokens=12,
                               temperature=0, extra_body={"ignore_eos": True})
            deadline = time.monotonic() + 120
            while _migrating(cluster, victim) < 1:  # the turn is there, waiting for the export
                assert time.monotonic() < deadline and not turn.done(), "the turn never waited on its replica"
                time.sleep(0.05)
            ray.kill(ray.get_actor(_actor_name(victim), namespace="serve"), no_restart=True)
        done = turn.result(timeout=300)  # the holder runs again: the retry is served
    statuses = [status for status, _ in seen]
    assert statuses[0] == 503 and statuses[-1] == 200, seen
    error = json.loads(seen[0][1])["error"]
    assert error["code"] == "replica_failed" and error["retry_after"] >= 1
    assert done.choices[0].message.content == offline(follow)


def test_a_replica_killed_mid_stream_ends_only_its_own_stream(cluster):
    """Last in this module: the killed replica is replaced by Serve afterwards."""
    two_replicas(cluster)
    body = {"model": MODEL, "prompt": "Count with me:", "max_tokens": 480, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{cluster.base_url}/v1/completions", json=body, timeout=120) as r:
        victim = r.headers["x-strata-replica"]
        other = next(n for n in _replica_ids() if n != victim)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            survivor = pool.submit(_block, cluster, other, 3000)
            events = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 3:
                        ray.kill(ray.get_actor(_actor_name(victim), namespace="serve"), no_restart=True)
            assert survivor.result()  # the other replica's stream ran to its end
    error = json.loads(events[-1])["error"]
    assert error["code"] == "replica_failed" and error["type"] == "unavailable_error" and error["retry_after"] >= 1


def _replica_ids() -> list[str]:
    return replica_ids("strata")


def _actor_name(replica_id: str) -> str:
    return f"SERVE_REPLICA::strata#{REPLICA_DEPLOYMENT}#{replica_id}"
