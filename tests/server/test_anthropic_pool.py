"""A full KV pool on the Messages route: Anthropic's 529 `overloaded_error` with retry-after,
before the stream (a plain answer) and after it started (an `error` event); the anthropic
client's own retry then succeeds. The pool server: 16 chunks x 16 cells, 2 lanes, streams
that start at once; a 200-id prompt decoding holds 13-14 chunks, so no chat prompt of over
48 tokens fits beside it (parked conversations give way first, all together at most 3 chunks).
"""

from __future__ import annotations

import json

import pytest
from held import running_long

from tests.conftest import require

anthropic = require("anthropic")

LONG_USER = "Please list, one per line, " + " ".join(f"word{i}" for i in range(40)) + "."
BODY = {"model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": LONG_USER}]}


def test_full_pool_is_529_overloaded_then_the_clients_retry_succeeds(pool_server):
    client = pool_server.anthropic(max_retries=10)
    def refused_stream() -> list[str]:
        with pool_server.client() as c, c.stream("POST", "/v1/messages", json={**BODY, "stream": True}) as s:
            assert s.status_code == 200  # sse_keepalive_s=0: the stream starts at once
            return [line for line in s.iter_lines() if line]

    with running_long(pool_server, 7000) as held:  # the long one's steps held at the gate
        with pool_server.client() as c:
            r = held.send(lambda: c.post("/v1/messages", json=BODY))
        lines = held.send(refused_stream)
        with pytest.raises(anthropic.OverloadedError) as caught:
            held.send(lambda: pool_server.anthropic(max_retries=0).messages.create(**BODY))
        # its first try meets the long one too; retried after retry-after until the long one ends
        done = held.send(lambda: client.messages.create(**BODY), then_release=True)
    assert r.status_code == 529, r.text
    assert int(r.headers["retry-after"]) >= 1
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
    assert "pool" in body["error"]["message"]
    assert caught.value.body["error"]["type"] == "overloaded_error"
    names = [line[len("event: "):] for line in lines if line.startswith("event: ")]
    assert names[:2] == ["message_start", "content_block_start"] and names[-1] == "error"
    assert "message_stop" not in names
    error = json.loads(lines[-1][len("data: "):])
    assert error["type"] == "error" and error["error"]["type"] == "overloaded_error"
    assert done.stop_reason in ("end_turn", "max_tokens") and 1 <= done.usage.output_tokens <= 2

