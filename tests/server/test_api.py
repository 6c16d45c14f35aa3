"""The OpenAI-compatible API over a real server, with the real `openai` client and httpx."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest
from serving import MAIN_ENGINE, sse_events

from strata import LLM, SamplingParams

CHAT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def offline(gguf_path) -> LLM:
    return LLM(model=gguf_path, **MAIN_ENGINE)


def test_models_health_schema(main_server):
    client = main_server.openai()
    assert [m.id for m in client.models.list().data] == ["smol"]
    with main_server.client() as c:
        assert c.get("/health").json() == {"status": "ok"}
        paths = c.get("/openapi.json").json()["paths"]
    for path in (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/health",
        "/metrics",
        "/slots",
    ):
        assert path in paths


def test_chat_whole_and_streamed(main_server):
    client = main_server.openai()
    whole = client.chat.completions.create(
        model="smol", messages=CHAT, max_tokens=10, temperature=0
    )
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens <= 10
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    stream = client.chat.completions.create(
        model="smol",
        messages=CHAT,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == choice.finish_reason
    assert (
        chunks[-1].choices == []
        and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    )


def test_chat_extra_fields_over_httpx(main_server):
    with main_server.client() as c:
        body = c.post(
            "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 4, "temperature": 0}
        ).json()
    assert body["object"] == "chat.completion" and body["model"] == "smol"
    assert body["choices"][0]["truncated"] is False
    assert set(body["timings"]) == {
        "cache_n",
        "prompt_n",
        "prompt_ms",
        "prompt_per_second",
        "predicted_n",
        "predicted_ms",
        "predicted_per_second",
        "draft_n",  # --spec ngram by default
        "draft_n_accepted",
    }


def test_timings_and_usage_count_the_cached_prefix(main_server):
    """Hand-worked counts: a fresh 40-token prompt reuses nothing; the same 40 tokens plus 2
    more reuse those 40 (the conversation cache holds them) and compute 2."""
    prompt = list(range(7000, 7040))  # ids no other test sends

    def complete(ids: list[int]) -> dict:
        with main_server.client() as c:
            r = c.post("/v1/completions", json={"prompt": ids, "max_tokens": 3, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        return r.json()

    for ids, cached in ((prompt, 0), (prompt + [7100, 7101], 40)):
        body = complete(ids)
        t, usage = body["timings"], body["usage"]
        assert (t["cache_n"], t["prompt_n"], t["predicted_n"]) == (cached, len(ids) - cached, 3)
        assert (usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]) == (len(ids), cached)


def test_completion_whole_and_streamed(main_server):
    client = main_server.openai()
    whole = client.completions.create(
        model="smol", prompt="The capital of France is", max_tokens=6, temperature=0
    )
    assert whole.choices[0].text and whole.usage.completion_tokens <= 6
    with (
        main_server.client() as c,
        c.stream(
            "POST",
            "/v1/completions",
            json={
                "prompt": "The capital of France is",
                "max_tokens": 6,
                "temperature": 0,
                "stream": True,
            },
        ) as r,
    ):
        assert r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == whole.choices[0].text
    assert chunks[-1]["choices"][0]["finish_reason"] == whole.choices[0].finish_reason
    assert chunks[-1]["choices"][0]["truncated"] is False and "timings" in chunks[-1]


def test_greedy_over_http_equals_offline(main_server, offline):
    messages = [{"role": "user", "content": "Write a haiku about rivers."}]
    params = SamplingParams(max_tokens=16, temperature=0)
    want_chat = offline.chat(messages, params)[0]
    want_text = offline.generate("Once upon a time, in a quiet village,", params)[0]
    client = main_server.openai()
    got_chat = client.chat.completions.create(
        model="smol", messages=messages, max_tokens=16, temperature=0
    )
    got_text = client.completions.create(
        model="smol", prompt="Once upon a time, in a quiet village,", max_tokens=16, temperature=0
    )
    assert got_chat.choices[0].message.content == want_chat.text
    assert got_chat.choices[0].finish_reason == want_chat.finish_reason
    assert got_text.choices[0].text == want_text.text


def test_two_conversations_at_once(main_server):
    """Two streams decode in the same steps: the second starts while the first is decoding,
    the engine shows both lanes busy, and the first keeps sending while the second does.

    Both streams are read by one asyncio loop, so `arrivals` is one order of their tokens; the
    margins (the first has 64 tokens, the second 12) are counted in engine steps, not seconds,
    so a slow or busy machine cannot make them flake."""
    first_len, second_len = 64, 12

    def body(prompt: str, max_tokens: int) -> dict:
        return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "stream": True}

    async def main() -> tuple[list[str], list[dict]]:
        arrivals: list[str] = []  # "first" / "second", one per token with text, in arrival order
        slots_seen: list[dict] = []
        first_decoding = asyncio.Event()
        async with httpx.AsyncClient(base_url=main_server.base_url, headers=main_server.headers,
                                     timeout=120.0) as c:

            async def stream(name: str, prompt: str, max_tokens: int) -> None:
                async with c.stream("POST", "/v1/completions", json=body(prompt, max_tokens)) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        if json.loads(line[len("data: "):])["choices"][0]["text"]:
                            arrivals.append(name)
                            if name == "first":
                                first_decoding.set()
                            elif arrivals.count("second") == 1:  # the engine's view, now
                                slots_seen.extend((await c.get("/slots")).json())

            first = asyncio.create_task(stream("first", "Tell me about cats.", first_len))
            await asyncio.wait_for(first_decoding.wait(), 120)
            await asyncio.gather(first, stream("second", "Tell me about the moon.", second_len))
        return arrivals, slots_seen

    arrivals, slots = asyncio.run(main())
    assert 0 < arrivals.count("first") <= first_len and 0 < arrivals.count("second") <= second_len
    def last(name: str) -> int:
        return len(arrivals) - 1 - arrivals[::-1].index(name)

    begin, end = arrivals.index("second"), last("second")
    assert begin < last("first"), f"the first finished before the second began: {arrivals}"
    # Decoding together: the first sent about one token per token of the second meanwhile.
    assert arrivals[begin:end].count("first") >= arrivals.count("second") // 2, arrivals
    busy = [s for s in slots if s["request_id"] is not None and s["state"] in ("prefilling", "decoding")]
    assert len(busy) >= 2, slots


def test_appended_turn_reports_cached_tokens(main_server):
    client = main_server.openai()
    first = [
        {"role": "system", "content": "You answer in one line."},
        {"role": "user", "content": "What is a lighthouse?"},
    ]
    a = client.chat.completions.create(model="smol", messages=first, max_tokens=12, temperature=0)
    follow = first + [
        {"role": "assistant", "content": a.choices[0].message.content},
        {"role": "user", "content": "And who keeps it?"},
    ]
    b = client.chat.completions.create(model="smol", messages=follow, max_tokens=6, temperature=0)
    cached = b.usage.prompt_tokens_details.cached_tokens
    assert cached >= a.usage.prompt_tokens, (cached, a.usage.prompt_tokens)
    assert cached < b.usage.prompt_tokens


def test_logprobs(main_server):
    client = main_server.openai()
    r = client.chat.completions.create(
        model="smol", messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-4)
    c = client.completions.create(
        model="smol", prompt="One, two,", max_tokens=3, temperature=0, logprobs=1
    )
    assert (
        len(c.choices[0].logprobs.tokens) == 3 and len(c.choices[0].logprobs.top_logprobs[0]) == 1
    )


def test_stop_and_seed(main_server):
    client = main_server.openai()
    base = (
        client.completions.create(model="smol", prompt="1, 2, 3, 4,", max_tokens=8, temperature=0)
        .choices[0]
        .text
    )
    assert "," in base.strip()
    stopped = client.completions.create(
        model="smol", prompt="1, 2, 3, 4,", max_tokens=8, temperature=0, stop=[","]
    )
    assert stopped.choices[0].text == base[: base.index(",")]
    assert stopped.choices[0].finish_reason == "stop"

    def sample(seed: int) -> str:
        return (
            client.completions.create(
                model="smol",
                prompt="My favourite word is",
                max_tokens=6,
                temperature=1.0,
                seed=seed,
            )
            .choices[0]
            .text
        )

    assert sample(7) == sample(7)


def test_streamed_text_is_whole_characters_and_stops_cleanly(main_server):
    body = {"prompt": "日本の首都は", "max_tokens": 12, "temperature": 0}
    with main_server.client() as c:
        whole = c.post("/v1/completions", json=body).json()["choices"][0]["text"]
        stopped = c.post("/v1/completions", json={**body, "stop": ["。"]}).json()["choices"][0]
        with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            deltas = [json.loads(e)["choices"][0]["text"] for e in sse_events(r) if e != "[DONE]"]
        with c.stream(
            "POST", "/v1/completions", json={**body, "stop": ["。"], "stream": True}
        ) as r:
            stopped_deltas = [
                json.loads(e)["choices"][0]["text"] for e in sse_events(r) if e != "[DONE]"
            ]
    assert "".join(deltas) == whole
    # Characters here span several tokens; none is split across deltas. Only a character the
    # answer never finished (max_tokens cut it) is flushed as U+FFFD, at the very end.
    text_deltas = [d for d in deltas if d]
    assert not any("\ufffd" in d for d in text_deltas[:-1])
    assert "\ufffd" not in text_deltas[-1].rstrip("\ufffd")
    assert "".join(stopped_deltas) == stopped["text"] and "。" not in stopped["text"]


def test_client_that_gives_up_on_a_whole_answer_is_aborted(main_server):
    """The client hangs up while its whole answer is being made: the engine's steps wait at
    the gate (step_gate.py) after the request's first step, so the answer cannot end first."""
    before = main_server.metrics().get('strata_requests_finished_total{finish_reason="abort"}', 0)
    body = json.dumps({"prompt": "Count slowly:", "max_tokens": 64, "temperature": 0, "ignore_eos": True})
    host, port = main_server.base_url.removeprefix("http://").split(":")
    gate = main_server.gate
    gate.hold()
    try:
        with socket.create_connection((host, int(port))) as sock:  # raw HTTP: the test decides when it leaves
            sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
                          f"Authorization: Bearer {main_server.api_key}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
            first = gate.steps
            gate.allow(1)  # admitted, its prompt read: it holds a lane and waits for its next step
            gate.wait_steps(first + 1)
            main_server.wait_until(lambda m: m["strata_requests_running"] == 1)
    finally:
        gate.release()
    main_server.wait_until(
        lambda m: (
            m["strata_requests_running"] == 0
            and m.get('strata_requests_finished_total{finish_reason="abort"}', 0) > before
        )
    )


def test_slots_and_metrics(main_server):
    with main_server.client() as c:
        slots = c.get("/slots").json()
    assert [s["id"] for s in slots] == list(range(1 + MAIN_ENGINE["batch"]))
    chunk = MAIN_ENGINE["kv_chunk"]
    for s in slots:  # nothing runs now: each lane is empty or holds an idle conversation, whole chunks
        assert s["state"] in ("empty", "idle") and s["n_ctx"] == MAIN_ENGINE["max_context"]
        assert s["chunks_held"] == -(-s["conversation_tokens"] // chunk), s
        assert (s["state"] == "empty") == (s["conversation_tokens"] == 0)
    m = main_server.metrics()
    for name in (
        'strata_kv_chunks{state="total"}',
        'strata_kv_chunks{state="held"}',
        'strata_kv_chunks{state="parked"}',
        'strata_kv_chunks{state="free"}',
        'strata_kv_cells{state="held"}',
        'strata_kv_cells{state="parked"}',
        'strata_kv_cells{state="free"}',
        "strata_kv_usage_ratio",
        "strata_kv_evictions_total",
        "strata_kv_refusals_total",
        "strata_kv_truncations_total",
        'strata_kv_moves_total{kind="swap"}',
        "strata_time_to_first_token_seconds_count",
        "strata_inter_token_latency_seconds_count",
        "strata_generation_tokens_total",
        "strata_prompt_tokens_total",
        'strata_http_requests_total{route="/v1/chat/completions",status="200"}',
    ):
        assert name in m, name
    total = m['strata_kv_chunks{state="total"}']
    assert total == MAIN_ENGINE["kv_pool_tokens"] // chunk
    assert m['strata_kv_chunks{state="held"}'] + m['strata_kv_chunks{state="free"}'] == total
    assert (
        m["strata_generation_tokens_total"] > 0
        and m["strata_time_to_first_token_seconds_count"] > 0
    )


def test_disconnect_mid_stream_gives_chunks_back(main_server):
    before = main_server.wait_until(lambda m: m["strata_requests_running"] == 0)
    body = {
        "prompt": "A long story about a dragon named Quill who collected clocks:",
        "max_tokens": 400,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with main_server.client() as c, c.stream("POST", "/v1/completions", json=body) as r:
        for event in sse_events(r):
            if json.loads(event)["choices"][0]["text"]:
                break  # the first text: hang up
    after = main_server.wait_until(
        lambda m: (
            m["strata_requests_running"] == 0
            and m['strata_kv_chunks{state="active"}'] == 0
            and m.get('strata_requests_finished_total{finish_reason="abort"}', 0)
            > before.get('strata_requests_finished_total{finish_reason="abort"}', 0)
        )
    )
    # Nothing is held but parked conversations, and the aborted one is not among them.
    assert after['strata_kv_chunks{state="held"}'] == after['strata_kv_chunks{state="parked"}']
    evicted = after["strata_kv_evictions_total"] - before["strata_kv_evictions_total"]
    assert (
        after["strata_kv_conversations_parked"]
        == before["strata_kv_conversations_parked"] - evicted
    )
    with main_server.client() as c:
        assert all(s["request_id"] is None for s in c.get("/slots").json())
