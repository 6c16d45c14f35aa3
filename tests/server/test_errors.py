"""Bad requests each get their 400 (or 401/404/413) in OpenAI's error shape."""

from __future__ import annotations

import json

import openai
import pytest
from serving import MAIN_ENGINE

OK = [{"role": "user", "content": "hi"}]


def chat(**fields) -> dict:
    return {"messages": OK, "max_tokens": 2, **fields}


CHAT_CASES = {
    # name: (body, status, code, param)
    "missing messages": ({"max_tokens": 2}, 400, "missing_field", "messages"),
    "empty messages": ({"messages": []}, 400, "invalid_request_error", "messages"),
    "unknown role": (
        {"messages": [{"role": "robot", "content": "x"}]},
        400,
        "invalid_request_error",
        "messages[0].role",
    ),
    "content not text": (
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        },
        400,
        "invalid_request_error",
        "messages[0].content[0]",
    ),
    "unknown message field": (
        {"messages": [{"role": "user", "content": "x", "mood": "happy"}]},
        400,
        "unknown_field",
        "messages[0].mood",
    ),
    "unknown field": (chat(frobnicate=True), 400, "unknown_field", "frobnicate"),
    "temperature as string": (chat(temperature="hot"), 400, "invalid_request_error", "temperature"),
    "max_tokens as string": (chat(max_tokens="10"), 400, "invalid_request_error", "max_tokens"),
    "stream as string": (chat(stream="yes"), 400, "invalid_request_error", "stream"),
    "negative max_tokens": (chat(max_tokens=-1), 400, "invalid_request_error", "max_tokens"),
    "zero max_completion_tokens": (
        chat(max_completion_tokens=0),
        400,
        "invalid_request_error",
        "max_completion_tokens",
    ),
    "huge max_tokens": (chat(max_tokens=10**12), 400, "invalid_request_error", "max_tokens"),
    "disagreeing max tokens": (
        chat(max_tokens=3, max_completion_tokens=4),
        400,
        "invalid_request_error",
        "max_completion_tokens",
    ),
    "negative temperature": (chat(temperature=-1), 400, "invalid_request_error", "temperature"),
    "huge temperature": (chat(temperature=1e9), 400, "invalid_request_error", "temperature"),
    "top_p over 1": (chat(top_p=2), 400, "invalid_request_error", "top_p"),
    "seed too big": (chat(seed=2**70), 400, "invalid_request_error", "seed"),
    "stop not strings": (chat(stop=[1, 2]), 400, "invalid_request_error", "stop"),
    "n of 17": (chat(n=17), 400, "invalid_request_error", "n"),
    "n of 0": (chat(n=0), 400, "invalid_request_error", "n"),
    "top_logprobs without logprobs": (
        chat(top_logprobs=2),
        400,
        "invalid_request_error",
        "top_logprobs",
    ),
    "too many top_logprobs": (
        chat(logprobs=True, top_logprobs=50),
        400,
        "invalid_request_error",
        "top_logprobs",
    ),
    "stream_options without stream": (
        chat(stream_options={"include_usage": True}),
        400,
        "invalid_request_error",
        "stream_options",
    ),
    "presence_penalty": (chat(presence_penalty=2.5), 400, "invalid_request_error", "presence_penalty"),
    "repeat_penalty": (chat(repeat_penalty=0.0), 400, "invalid_request_error", "repeat_penalty"),
    "logit_bias": (chat(logit_bias={"1": 500.0}), 400, "invalid_request_error", "logit_bias"),
    "logit_bias token": (chat(logit_bias={"99999999": 1.0}), 400, "invalid_request_error", "logit_bias"),
    "min_tokens": (chat(min_tokens=5, max_tokens=2), 400, "invalid_request_error", "min_tokens"),
    "a built-in tool": (chat(tools=[{"type": "web_search"}]), 400, "unsupported_parameter", "tools[0].type"),
    "an unknown tool": (
        chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice={
            "type": "function", "function": {"name": "g"}}),
        400,
        "invalid_request_error",
        "tool_choice",
    ),
    "structural tags": (
        chat(response_format={"type": "structural_tag"}),
        400,
        "unsupported_parameter",
        "response_format.type",
    ),
    "two grammars": (
        chat(response_format={"type": "json_object"}, guided_regex="a+"),
        400,
        "invalid_request_error",
        "guided_regex",
    ),
    "a bad GBNF grammar": (chat(grammar="root ::= ("), 400, "invalid_grammar", "grammar"),
    "a template variable the server sets": (
        chat(chat_template_kwargs={"messages": []}),
        400,
        "invalid_request_error",
        "chat_template_kwargs.messages",
    ),
    "unknown model": (chat(model="gpt-4o"), 404, "model_not_found", "model"),
}


@pytest.mark.parametrize("case", list(CHAT_CASES), ids=list(CHAT_CASES))
def test_bad_chat_request(main_server, case):
    body, status, code, param = CHAT_CASES[case]
    with main_server.client() as c:
        r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    assert error["type"] == "invalid_request_error"
    assert error["message"]


COMPLETION_CASES = {
    "prompt missing": ({"max_tokens": 2}, "missing_field", "prompt"),
    "prompt a number": ({"prompt": 5}, "invalid_request_error", "prompt"),
    "empty prompt": ({"prompt": ""}, "invalid_request_error", "prompt"),
    "token id out of range": ({"prompt": [10**9]}, "invalid_request_error", "prompt"),
    "two prompts": ({"prompt": ["a", "b"]}, "unsupported_parameter", "prompt"),
    "echo": ({"prompt": "a", "echo": True}, "unsupported_parameter", "echo"),
    "best_of": ({"prompt": "a", "best_of": 3}, "unsupported_parameter", "best_of"),
    "logprobs too many": ({"prompt": "a", "logprobs": 21}, "invalid_request_error", "logprobs"),
    "messages on completions": ({"prompt": "a", "messages": OK}, "unknown_field", "messages"),
}


@pytest.mark.parametrize("case", list(COMPLETION_CASES), ids=list(COMPLETION_CASES))
def test_bad_completion_request(main_server, case):
    body, code, param = COMPLETION_CASES[case]
    with main_server.client() as c:
        r = c.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error


@pytest.mark.parametrize(
    "raw", [b"{not json", b"[1, 2]", b'"text"', b""], ids=["malformed", "array", "string", "empty"]
)
def test_body_that_is_not_an_object(main_server, raw):
    with main_server.client() as c:
        r = c.post(
            "/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"}
        )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_json"


def test_prompt_over_max_context_says_both_numbers(main_server):
    long = "word " * (MAIN_ENGINE["max_context"] + 50)
    with main_server.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": long}]})
        r2 = c.post("/v1/completions", json={"prompt": long})
    assert r.status_code == 400 and r2.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert str(MAIN_ENGINE["max_context"]) in error["message"]
    num_prompt = int(error["message"].split("the prompt has ")[1].split()[0])
    assert num_prompt > MAIN_ENGINE["max_context"]
    assert (
        r2.json()["error"]["code"] == "context_length_exceeded"
        and r2.json()["error"]["param"] == "prompt"
    )
    # And through the openai client, as its own exception type.
    with pytest.raises(openai.BadRequestError) as caught:
        main_server.openai().chat.completions.create(
            model="smol", messages=[{"role": "user", "content": long}]
        )
    assert caught.value.code == "context_length_exceeded"


def test_body_too_large(main_server):
    with main_server.client() as c:
        r = c.post(
            "/v1/chat/completions",
            content=b"x" * (2 << 20),
            headers={"Content-Type": "application/json"},
        )
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_api_key(main_server):
    with main_server.client(headers={"Authorization": "Bearer wrong"}) as wrong:
        assert wrong.get("/v1/models").status_code == 401
        r = wrong.post("/v1/chat/completions", content=b"{not json")  # auth comes before parsing
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["WWW-Authenticate"] == "Bearer"
        assert wrong.get("/metrics").status_code == 401 and wrong.get("/slots").status_code == 401
        assert wrong.get("/health").status_code == 200  # liveness stays open
    import httpx

    assert httpx.get(f"{main_server.base_url}/v1/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{main_server.base_url}/v1", api_key="nope").models.list()
    with main_server.client() as ok:
        assert ok.get("/v1/models").status_code == 200


def test_unknown_route_is_404_in_openai_shape(main_server):
    with main_server.client() as c:
        r = c.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    "content_type", [None, "application/x-www-form-urlencoded"], ids=["none", "curl -d"]
)
def test_curl_style_body_is_read_as_json(main_server, content_type):
    headers = {**main_server.headers, **({"Content-Type": content_type} if content_type else {})}
    with main_server.client(headers=headers) as c:
        r = c.post(
            "/v1/completions", content=json.dumps({"prompt": "Hi", "max_tokens": 1}).encode()
        )
    assert r.status_code == 200, r.text
