"""Tool-call parsers on scripted model outputs through the real server, for every format
(hermes, llama3_json, mistral; `--tool-call-parser` names it): each answer of
tests/unit/test_tool_parsers.py's table (text before and after a call, several calls, malformed
and cut-off calls, JSON that is no call) is what a tiny model says, held to exactly that text
by an escaped-literal `guided_regex` (the grammar path of structured outputs). The whole answer
and the reassembled stream each give the table's content and calls, and `finish_reason`
`tool_calls` exactly when there are calls."""

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


@pytest.mark.parametrize("name, answer, content, calls", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_scripted_answers_whole_and_streamed(servers, name, answer, content, calls):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Go."}], "tools": TOOLS, "temperature": 0,
            "max_tokens": 256, "guided_regex": literal(answer)}
    finish = "tool_calls" if calls else "stop"
    with servers[name].client() as c:
        whole = c.post("/v1/chat/completions", json=body)
        assert whole.status_code == 200, whole.text
        choice = whole.json()["choices"][0]
        assert (choice["message"]["content"] or "") == content
        assert _calls(choice["message"].get("tool_calls")) == calls
        assert choice["finish_reason"] == finish
        text, deltas, reasons = "", {}, []
        with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for ch in json.loads(line[6:])["choices"]:
                    text += ch["delta"].get("content") or ""
                    reasons.append(ch["finish_reason"])
                    for d in ch["delta"].get("tool_calls") or []:
                        call = deltas.setdefault(d["index"], {"id": None, "function": {"name": "", "arguments": ""}})
                        call["id"] = d.get("id") or call["id"]
                        call["function"]["name"] += d.get("function", {}).get("name") or ""
                        call["function"]["arguments"] += d.get("function", {}).get("arguments") or ""
    assert text == content
    assert _calls([deltas[i] for i in sorted(deltas)]) == calls
    assert all(call["id"] for call in deltas.values())
    assert [r for r in reasons if r] == [finish]
