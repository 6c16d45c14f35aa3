"""Tool-call parsers and the reasoning split on scripted answers, for every format: text around
calls, several calls, malformed and cut-off calls; fed whole, and fed in pieces of every size
(the stream gives the same calls and content, and never leaks a marker as content)."""

from __future__ import annotations

import json

import pytest

from strata.server.answer import AnswerShape, read_whole
from strata.server.reasoning import Reasoning, reasoning_for
from strata.server.tools.parsers import FORMATS, ToolCallParser, format_for_template, parse_all

W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
T = '{"name": "get_time", "arguments": {"zone": "CET"}}'

# (format, answer, content, [(name, arguments)])
CASES = [
    ("hermes", f"<tool_call>\n{W}\n</tool_call>", "", [("get_weather", {"city": "Paris"})]),
    ("hermes", f"Let me look.\n<tool_call>\n{W}\n</tool_call>\nDone.", "Let me look.\n\nDone.",
     [("get_weather", {"city": "Paris"})]),
    ("hermes", f"<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{T}\n</tool_call>", "",
     [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]),
    ("hermes", "<tool_call>\n{oops}\n</tool_call> ok", "<tool_call>\n{oops}\n</tool_call> ok", []),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    ("hermes", f"<tool_call>\n{W}", "", [("get_weather", {"city": "Paris"})]),  # cut before its end tag
    ("hermes", '<tool_call>\n{"name": "get_wea', '<tool_call>\n{"name": "get_wea', []),  # cut inside
    ("hermes", "a < b and <tool_ but no call", "a < b and <tool_ but no call", []),
    ("hermes", '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', "", [("f", {"x": 1})]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "",
     [("get_weather", {"city": "Paris"})]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "",
     [("get_weather", {"city": "Paris"})]),
    ("llama3_json", 'Sure. <|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"k": 2}}',
     "Sure. ", [("a", {}), ("b", {"k": 2})]),
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),  # JSON, not a call
    ("llama3_json", '{"name": "get_weather", "parameters": {"ci', '{"name": "get_weather", "parameters": {"ci', []),
    ("llama3_json", "The weather is fine.", "The weather is fine.", []),
    ("mistral", f"[TOOL_CALLS][{W}, {T}]", "", [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]),
    ("mistral", f"Checking. [TOOL_CALLS][{W}]", "Checking. ", [("get_weather", {"city": "Paris"})]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}', "",
     [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]),
    ("mistral", "[TOOL_CALLS][{broken", "[TOOL_CALLS][{broken", []),
    ("mistral", "No tools needed.", "No tools needed.", []),
]


def _calls(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("name, answer, content, calls", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_whole_answers(name, answer, content, calls):
    got_content, got_calls = parse_all(FORMATS[name], answer)
    assert got_content == content
    assert _calls(got_calls) == calls
    assert len({c.id for c in got_calls}) == len(got_calls)


@pytest.mark.parametrize("name, answer, content, calls", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_streamed_answers_equal_whole_ones(name, answer, content, calls, size):
    parser = ToolCallParser(FORMATS[name])
    pieces = []
    for i in range(0, len(answer), size):
        pieces += parser.feed(answer[i : i + size])
    pieces += parser.finish()
    assert "".join(p for p in pieces if isinstance(p, str)) == content
    assert _calls([p for p in pieces if not isinstance(p, str)]) == calls


def test_text_is_held_only_while_a_call_may_be_starting():
    parser = ToolCallParser(FORMATS["hermes"])
    assert parser.feed("Hello <tool") == ["Hello "]  # "<tool" may start "<tool_call>"
    assert parser.feed("box> there") == ["<toolbox> there"]
    llama = ToolCallParser(FORMATS["llama3_json"])
    assert llama.feed("  ") == []  # the answer may still be a bare JSON call
    assert llama.feed("Hi") == ["  Hi"]


def test_the_format_follows_the_template():
    assert format_for_template("{{ '[TOOL_CALLS]' }}").name == "mistral"
    assert format_for_template("<|start_header_id|>{{ '<|python_tag|>' }}").name == "llama3_json"
    assert format_for_template("<|im_start|>{% if tools %}<tool_call>{% endif %}").name == "hermes"
    assert format_for_template(None).name == "hermes"


THINK = Reasoning("<think>", "</think>", inside=False)


@pytest.mark.parametrize("answer, reasoning, content", [
    ("<think>Paris is in France.</think>\nIt is sunny.", "Paris is in France.", "It is sunny."),
    ("  <think>a</think>b", "a", "b"),
    ("<think>never closed", "never closed", ""),
    ("No thinking here. <think>x</think>", "", "No thinking here. <think>x</think>"),
    ("<thi", "", "<thi"),
])
def test_reasoning_split(answer, reasoning, content):
    for size in (1, 4, len(answer)):
        reader = AnswerShape(THINK).reader()
        parts = [reader.feed(answer[i : i + size]) for i in range(0, len(answer), size)] + [reader.finish()]
        assert "".join(r for p in parts for r in p.reasoning) == reasoning
        assert "".join(c for p in parts for c in p.content) == content


def test_a_prompt_that_opens_the_block_starts_inside_it():
    spec = reasoning_for("{{ '<think>' }}", "<|im_start|>assistant\n<think>\n")
    assert spec.inside
    parts = read_whole(AnswerShape(spec), "plan</think>answer")
    assert parts.reasoning == ["plan"] and parts.content == ["answer"]


def test_reasoning_then_a_tool_call():
    parts = read_whole(AnswerShape(THINK, FORMATS["hermes"]), f"<think>need weather</think><tool_call>{W}</tool_call>")
    assert parts.reasoning == ["need weather"] and not "".join(parts.content) and _calls(parts.calls)[0][0] == "get_weather"


def test_without_parallel_calls_only_the_first_is_kept():
    parts = read_whole(AnswerShape(None, FORMATS["hermes"], parallel=False),
                       f"<tool_call>{W}</tool_call><tool_call>{T}</tool_call>")
    assert _calls(parts.calls) == [("get_weather", {"city": "Paris"})]
