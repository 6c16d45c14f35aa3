"""The KV pool's behaviour over HTTP, on a pool of 16 chunks x 16 cells (256 cells, 2 lanes).

Prompts are token ids, so chunk counts are exact: a prompt of 200 ids holds 13 chunks at
admission and 14 by its last token; a prompt of 60 ids needs 4 more, which are never free
while the long one runs (parked conversations from earlier tests give way first, and even
all of them together leave at most 3).

Order, not speed: while a long request runs, the engine's steps wait at the server's step gate
(step_gate.py), and each request the test sends meets the engine after a counted number of
steps, so the long one is still decoding however fast this machine runs it.
"""

from __future__ import annotations

import json
import threading

import openai
import pytest
from held import ids, running_long
from serving import RunningServer, sse_events

def counter(server: RunningServer, name: str) -> float:
    return server.metrics().get(name, 0.0)


def test_full_pool_is_503_then_the_clients_retry_succeeds(pool_server):
    small = {"prompt": ids(3000, 60), "max_tokens": 2, "temperature": 0}
    refusals = counter(pool_server, "strata_kv_refusals_total")
    client = pool_server.openai(max_retries=10)
    with running_long(pool_server, 1000) as held:
        with pool_server.client() as c:
            r = held.send(lambda: c.post("/v1/completions", json=small))
        assert r.status_code == 503
        error = r.json()["error"]
        assert (
            error["code"] == "kv_pool_full"
            and error["type"] == "unavailable_error"
            and error["message"]
        )
        assert int(r.headers["Retry-After"]) >= 1
        # The openai client's first try meets the long one too; its own retry (it honours
        # Retry-After) succeeds once the long one ends.
        done = held.send(lambda: client.completions.create(model="smol", **small), then_release=True)
    assert (
        done.choices[0].finish_reason in ("stop", "length")
        and 1 <= done.usage.completion_tokens <= 2
    )
    assert (
        counter(pool_server, "strata_kv_refusals_total") >= refusals + 2
    )  # ours, and the client's first try


def test_refusal_after_the_stream_started_is_an_sse_error(pool_server):
    body = {"prompt": ids(5000, 60), "max_tokens": 2, "temperature": 0, "stream": True}
    def refused_stream() -> list[str]:
        with pool_server.client() as c, c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200  # sse_keepalive_s=0: the stream starts before admission
            return list(sse_events(r))

    with running_long(pool_server, 1300) as held:
        events = held.send(refused_stream)
        with pytest.raises(openai.APIError) as caught:
            held.send(lambda: list(pool_server.openai(max_retries=0).completions.create(model="smol", **body)))
    assert events[-1] == "[DONE]" and len(events) == 2
    error = json.loads(events[0])["error"]
    assert (
        error["code"] == "kv_pool_full"
        and error["type"] == "unavailable_error"
        and error["retry_after"] >= 1
    )
    assert caught.value.body["code"] == "kv_pool_full"


def _stream_until_done(server: RunningServer, body: dict, out: list) -> None:
    with server.client() as c, c.stream("POST", "/v1/completions", json=body) as r:
        out.extend(json.loads(e) for e in sse_events(r) if e != "[DONE]")


def flush_parked(server: RunningServer, start: int) -> None:
    """Leave one parked conversation holding the whole pool: the next admission evicts it,
    so from then on no parked conversation can give way."""
    with server.client() as c:
        r = c.post(
            "/v1/completions", json={"prompt": ids(start, 250), "max_tokens": 1, "temperature": 0}
        )
    assert r.status_code == 200, r.text


def test_the_lane_that_cannot_grow_ends_truncated(pool_server):
    # Older: 100 prompt cells, younger: 110; each holds 7 chunks (112 cells) at admission and
    # 2 are free. The younger (admitted two steps after the older's first token), ahead within
    # its chunk, takes the first free chunk at 112, the older the last one at 112; at 128 the
    # younger cannot grow and ends truncated, while the older reaches its max_tokens (130
    # cells) in the room the younger gave back.
    truncations = counter(pool_server, "strata_kv_truncations_total")
    younger = {
        "prompt": ids(8000, 110),
        "max_tokens": 40,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    flush_parked(pool_server, 6000)
    with running_long(pool_server, 7000, num_prompt=100, max_tokens=30) as held:
        chunks: list = []
        held.send(lambda: _stream_until_done(pool_server, younger, chunks), then_release=True)
    final = chunks[-1]["choices"][0]
    assert final["finish_reason"] == "length" and final["truncated"] is True
    last = held.rest[-1]["choices"][0]
    assert last["finish_reason"] == "length" and last["truncated"] is False
    assert counter(pool_server, "strata_kv_truncations_total") == truncations + 1

    # The same through the openai client without streaming.
    flush_parked(pool_server, 6500)
    with running_long(pool_server, 9000, num_prompt=100, max_tokens=30) as held:
        answer = held.send(lambda: pool_server.openai(max_retries=0).completions.create(
            model="smol",
            prompt=ids(10000, 110),
            max_tokens=40,
            temperature=0,
            extra_body={"ignore_eos": True},
        ), then_release=True)
    assert answer.choices[0].finish_reason == "length" and answer.choices[0].truncated is True
    assert answer.usage.completion_tokens < 40
    last = held.rest[-1]["choices"][0]
    assert last["finish_reason"] == "length" and last["truncated"] is False
    assert counter(pool_server, "strata_kv_truncations_total") == truncations + 2


def test_too_many_waiting_is_503(pool_server):
    # Two lanes busy, one request waiting (max_waiting=1): the next one is refused at the door
    # (no step needed: the loop counts its open requests).
    waiting_result: list = []

    def wait_for_lane() -> None:
        with pool_server.client() as c:
            waiting_result.append(
                c.post("/v1/completions", json={"prompt": ids(12000, 8), "max_tokens": 1})
            )

    with running_long(pool_server, 11000, num_prompt=20, max_tokens=80) as first:
        with running_long(pool_server, 11500, num_prompt=20, max_tokens=80) as second:
            before = second.submits.count
            waiter = threading.Thread(target=wait_for_lane)
            waiter.start()
            second.submits.wait_beyond(before)
            with pool_server.client() as c:
                r = c.post("/v1/completions", json={"prompt": ids(13000, 8), "max_tokens": 1})
            assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
            assert int(r.headers["Retry-After"]) >= 1
    waiter.join(120)
    assert waiting_result[0].status_code == 200
