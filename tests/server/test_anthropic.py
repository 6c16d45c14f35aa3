"""Anthropic's Messages API over a real server, with the real `anthropic` client and httpx.

The main server computes in float32, so greedy text is exact: the Messages route and the
OpenAI chat route read the same prompt ids and must answer the same text.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import require

anthropic = require("anthropic")

CHAT = [{"role": "user", "content": "Name three colours."}]
SYSTEM = "You answer in one short sentence."
# anthropic>=2 dropped temperature/top_p/top_k from messages.create; the API takes them.
GREEDY = {"temperature": 0}


def openai_text(server, messages: list[dict], max_tokens: int, **extra) -> tuple[str, object]:
    whole = server.openai().chat.completions.create(
        model="smol", messages=messages, max_tokens=max_tokens, temperature=0, **extra
    )
    return whole.choices[0].message.content, whole


def events_of(response: httpx.Response) -> list[tuple[str, dict]]:
    """(event name, data) pairs of an SSE response, checking that each data has its name."""
    out, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: ") :])
            assert data["type"] == name, (name, data)
            out.append((name, data))
    return out


def test_whole_and_streamed_match_the_openai_route(main_server):
    client = main_server.anthropic()
    expected, _ = openai_text(main_server, [{"role": "system", "content": SYSTEM}, *CHAT], 12)
    whole = client.messages.create(
        model="smol", max_tokens=12, system=SYSTEM, messages=CHAT, extra_body=GREEDY
    )
    assert whole.type == "message" and whole.role == "assistant" and whole.model == "smol"
    assert whole.id.startswith("msg_") and [b.type for b in whole.content] == ["text"]
    assert whole.content[0].text == expected
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.stop_sequence is None
    assert whole.usage.output_tokens <= 12
    # System as text blocks, content as text blocks: the same prompt.
    blocks = client.messages.create(
        model="smol", max_tokens=12, extra_body=GREEDY,
        system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": CHAT[0]["content"]}]}],
    )
    assert blocks.content[0].text == expected
    with client.messages.stream(
        model="smol", max_tokens=12, system=SYSTEM, messages=CHAT, extra_body=GREEDY
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == expected
    assert final.content[0].text == expected and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    total = client.messages.count_tokens(model="smol", system=SYSTEM, messages=CHAT).input_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == total


def test_stream_events_in_anthropics_order(main_server):
    body = {"model": "smol", "max_tokens": 6, "messages": CHAT, "temperature": 0, "stream": True}
    with main_server.client() as c, c.stream("POST", "/v1/messages", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = events_of(r)
    names = [n for n, _ in events if n != "ping"]
    deltas = names[2:-3]
    assert names[:2] == ["message_start", "content_block_start"] and deltas
    assert set(deltas) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["id"].startswith("msg_")
    delta = dict(events)["message_delta"]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 6
    assert all(d["delta"]["type"] == "text_delta" for n, d in events if n == "content_block_delta")


def test_stop_sequences(main_server):
    client = main_server.anthropic()
    full = client.messages.create(model="smol", max_tokens=20, messages=CHAT, extra_body=GREEDY)
    text = full.content[0].text
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]
    cut = text[: text.index(stop)]
    stopped = client.messages.create(
        model="smol", max_tokens=20, messages=CHAT, extra_body=GREEDY, stop_sequences=["zzz", stop]
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stopped.content[0].text == cut
    with client.messages.stream(
        model="smol", max_tokens=20, messages=CHAT, extra_body=GREEDY, stop_sequences=[stop]
    ) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == (
        "stop_sequence", stop, cut
    )


def test_follow_up_reads_the_conversation_cache(main_server):
    client = main_server.anthropic()
    first_turn = [{"role": "user", "content": "Tell me a fact about the moon."}]
    first = client.messages.create(model="smol", max_tokens=16, messages=first_turn, extra_body=GREEDY)
    follow = [
        *first_turn,
        {"role": "assistant", "content": first.content[0].text},
        {"role": "user", "content": "And one about the sun?"},
    ]
    second = client.messages.create(model="smol", max_tokens=4, messages=follow, extra_body=GREEDY)
    total = client.messages.count_tokens(model="smol", messages=follow).input_tokens
    first_prompt = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens >= first_prompt
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == total
    assert second.usage.input_tokens < total - first_prompt + 1 + first.usage.output_tokens


def test_a_final_assistant_message_is_continued(main_server):
    client = main_server.anthropic()
    full = client.messages.create(model="smol", max_tokens=12, messages=CHAT, extra_body=GREEDY)
    words = full.content[0].text.split(" ")
    head = " ".join(words[:2])
    cont = client.messages.create(
        model="smol", max_tokens=8, extra_body=GREEDY,
        messages=[*CHAT, {"role": "assistant", "content": head}],
    )
    assert (head + cont.content[0].text).startswith(" ".join(words[:3]))


def test_errors_in_anthropics_shape(main_server):
    client = main_server.anthropic(max_retries=0)
    cases = [
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "bash_20250124"),
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
        ]}]}, "'image'"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "bogus": 1}]}]},
         "'bogus'"),
        ({"messages": [{"role": "assistant", "content": "Hi"}]}, "messages[0].role"),
        ({"extra_body": {"temperature": 1.5}}, "temperature"),
        ({"extra_body": {"top_k": -1}}, "top_k"),
        ({"stop_sequences": [""]}, "stop_sequences"),
    ]
    for extra, named in cases:
        kwargs = {"model": "smol", "max_tokens": 4, "messages": CHAT, **extra}
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(**kwargs)
        assert caught.value.body["type"] == "error", caught.value.body
        assert caught.value.body["error"]["type"] == "invalid_request_error"
        assert named in caught.value.body["error"]["message"], caught.value.body
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-nonesuch", max_tokens=4, messages=CHAT)
    assert caught.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.AuthenticationError) as caught:
        main_server.anthropic(max_retries=0, api_key="wrong").messages.create(
            model="smol", max_tokens=4, messages=CHAT
        )
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "the API key is not valid"},
    }
    with httpx.Client(base_url=main_server.base_url, timeout=60) as c:
        missing = c.post("/v1/messages", headers={"x-api-key": main_server.api_key},
                         json={"model": "smol", "messages": CHAT})
        no_key = c.post("/v1/messages", json={"model": "smol", "max_tokens": 1, "messages": CHAT})
        bearer = c.post("/v1/messages", headers=main_server.headers,
                        json={"model": "smol", "max_tokens": 1, "messages": CHAT})
        too_big = c.post("/v1/messages", headers={"x-api-key": main_server.api_key},
                         content=b"x" * ((1 << 20) + 1))
        foreign = c.post("/v1/messages", headers={"x-api-key": main_server.api_key,
                                                  "Origin": "https://evil.example"},
                         json={"model": "smol", "max_tokens": 1, "messages": CHAT})
    assert too_big.status_code == 413
    assert too_big.json() == {"type": "error", "error": {
        "type": "request_too_large",
        "message": "the request body is larger than --max-body-bytes 1048576"}}
    assert foreign.status_code == 403 and foreign.json()["error"]["type"] == "permission_error"
    assert missing.status_code == 400 and missing.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in missing.json()["error"]["message"]
    assert no_key.status_code == 401 and no_key.json()["error"]["type"] == "authentication_error"
    assert bearer.status_code == 200 and bearer.json()["type"] == "message"
