"""Tool-call parsers on scripted model outputs through the real server, for every format
(hermes, llama3_json, mistral; `--tool-call-parser` names it): each answer of
tests/unit/test_tool_parsers.py's table (text before and after a call, several calls, malformed
and cut-off calls, JSON that is no call) is what a tiny model says, held to exactly that text
by an escaped-literal `guided_regex` (the grammar path of structured outputs). The whole answer
and the reassembled stream each give the table's content and calls, and `finish_reason`
`tool_calls` exactly when there are calls. Reasoning the same way: `<think>` blocks split into
`reasoning_content`, before an answer or a call."""

from __future__ import annotations

import json

import pytest

from strata.server.settings import ServerSettings
from tests.server.serving import engine_loader, start_server
from tests.unit.test_tool_parsers import CASES

META = set("\\.+*?()|[]{}^$#&-~")  # the regex library's meta characters, escaped as literals
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
         for name in ("get_weather", "get_time", "f", "a", "b")]


def literal(text: str) -> str:
    return "".join("\\n" if ch == "\n" else f"\\{ch}" if ch in META else ch for ch in text)


@pytest.fixture(scope="module")
def servers(tiny_llama_dir):
    running = {name: start_server(ServerSettings(model_alias="tiny", tool_call_parser=name),
                                  engine_loader(tiny_llama_dir, dtype="float32", max_context=512, batch=1),
                                  model_id="tiny")
               for name in sorted({c[0] for c in CASES})}
    yield running
    for server in running.values():
        server.stop()


def _calls(tool_calls) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in tool_calls or []]


def said(server, answer: str, **extra) -> tuple[dict, dict]:
    """The whole answer's choice and the stream's reassembled choice when the model says `answer`."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Go."}], "tools": TOOLS, "temperature": 0,
            "max_tokens": 256, "guided_regex": literal(answer), **extra}
    with server.client() as c:
        whole = c.post("/v1/chat/completions", json=body)
        assert whole.status_code == 200, whole.text
        streamed = {"content": "", "reasoning_content": "", "tool_calls": {}, "finish_reasons": []}
        with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for ch in json.loads(line[6:])["choices"]:
                    streamed["content"] += ch["delta"].get("content") or ""
                    streamed["reasoning_content"] += ch["delta"].get("reasoning_content") or ""
                    if ch["finish_reason"]:
                        streamed["finish_reasons"].append(ch["finish_reason"])
                    for d in ch["delta"].get("tool_calls") or []:
                        call = streamed["tool_calls"].setdefault(
                            d["index"], {"id": None, "function": {"name": "", "arguments": ""}})
                        call["id"] = d.get("id") or call["id"]
                        call["function"]["name"] += d.get("function", {}).get("name") or ""
                        call["function"]["arguments"] += d.get("function", {}).get("arguments") or ""
    calls = streamed["tool_calls"]
    streamed["tool_calls"] = [calls[i] for i in sorted(calls)]
    return whole.json()["choices"][0], streamed


@pytest.mark.parametrize("name, answer, content, calls", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_scripted_answers_whole_and_streamed(servers, name, answer, content, calls):
    finish = "tool_calls" if calls else "stop"
    whole, streamed = said(servers[name], answer)
    assert (whole["message"]["content"] or "") == content
    assert _calls(whole["message"].get("tool_calls")) == calls
    assert whole["finish_reason"] == finish
    assert streamed["content"] == content
    assert _calls(streamed["tool_calls"]) == calls
    assert all(call["id"] for call in streamed["tool_calls"])
    assert streamed["finish_reasons"] == [finish]


@pytest.mark.parametrize("answer, reasoning, content, calls", [
    ("<think>The user wants weather.</think>\nIt is sunny.", "The user wants weather.", "It is sunny.", []),
    ('<think>Look it up.</think><tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
     "Look it up.", "", [("get_time", {"zone": "CET"})]),
    ("Plain answer. <think>not a block</think>", "", "Plain answer. <think>not a block</think>", []),
])
def test_scripted_reasoning_is_split_from_the_answer(servers, answer, reasoning, content, calls):
    whole, streamed = said(servers["hermes"], answer)
    for got in (whole["message"], streamed):
        assert (got.get("reasoning_content") or "") == reasoning
        assert (got["content"] or "") == content
        assert _calls(got.get("tool_calls")) == calls
    assert whole["finish_reason"] == ("tool_calls" if calls else "stop")
