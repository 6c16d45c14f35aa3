"""The agents' API on the real server with the default model (float32, the shared main_server):
the real `openai` client's `chat.completions.parse` with pydantic models, forced tool calls that
validate against their schemas, streamed tool-call deltas equal to the whole answer, n choices,
the Responses API with a follow-up that reuses the cache, the small endpoints, penalties."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, create_model

from tests.conftest import require

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                      "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}},
                   "required": ["zone"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

# Field types the grammar library serves; strings and lists bounded so an answer fits its budget.
FIELD_TYPES = st.sampled_from([
    (str, Field(max_length=10)), (int, Field(ge=0, le=1000)), (bool, Field()),
    (Literal["red", "green", "blue"], Field()), (list[int], Field(max_length=3)), (float, Field(ge=0, le=10)),
])


@st.composite
def models(draw) -> type[BaseModel]:
    names = draw(st.lists(st.sampled_from(["name", "age", "ok", "color", "scores", "size", "city"]),
                          min_size=1, max_size=3, unique=True))
    fields = {n: draw(FIELD_TYPES) for n in names}
    return create_model("Answer", **fields)


@settings(max_examples=3, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(model=models())
def test_parse_returns_the_pydantic_object(main_server, model):
    client = main_server.openai(timeout=600)
    got = client.chat.completions.parse(
        model="smol", messages=[{"role": "user", "content": "Fill in an example."}], response_format=model,
        temperature=0, max_tokens=64)
    choice = got.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, model)
    assert model.model_validate_json(choice.message.content) == choice.message.parsed


def test_a_schema_the_library_cannot_compile_is_a_400_naming_the_field(main_server):
    with main_server.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "response_format.json_schema.schema"
        r = c.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, "guided_regex": "(?<=a)b"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "guided_regex", r.text


def test_regex_and_choice_hold_the_answer(main_server):
    client = main_server.openai(timeout=600)
    got = client.chat.completions.create(model="smol", messages=ASK, temperature=0, max_tokens=12,
                                         extra_body={"guided_regex": "[A-Z][a-z]{2,8}"})
    import re
    assert re.fullmatch("[A-Z][a-z]{2,8}", got.choices[0].message.content), got
    got = client.completions.create(model="smol", prompt="Is the sea blue?", temperature=0, max_tokens=4,
                                    extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert got.choices[0].text in ("yes", "no")


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_calls_validate_against_their_schema(main_server, tool_choice):
    client = main_server.openai(timeout=600)
    got = client.chat.completions.create(model="smol", messages=ASK, tools=[WEATHER, TIME], tool_choice=tool_choice,
                                         temperature=0, max_tokens=80)
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    if isinstance(tool_choice, dict):
        assert {c.function.name for c in choice.message.tool_calls} == {"get_time"}


def test_streamed_tool_call_deltas_reassemble_to_the_whole_answer(main_server):
    client = main_server.openai(timeout=600)
    args = dict(model="smol", messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=80)
    whole = client.chat.completions.create(**args).choices[0]
    calls: dict[int, dict] = {}
    content, reasons = "", []
    for chunk in client.chat.completions.create(**args, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasons.append(choice.finish_reason)
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = d.id or call["id"]
                call["name"] += (d.function.name or "") if d.function else ""
                call["arguments"] += (d.function.arguments or "") if d.function else ""
    assert [c["name"] for c in calls.values()] == [c.function.name for c in whole.message.tool_calls]
    assert [c["arguments"] for c in calls.values()] == [c.function.arguments for c in whole.message.tool_calls]
    assert all(c["id"] for c in calls.values())
    assert content == (whole.message.content or "") and reasons[-1] == "tool_calls"


def test_tool_results_in_the_history_are_rendered(main_server):
    client = main_server.openai(timeout=600)
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees, sunny"},
    ]
    with main_server.client() as c:
        prompt = c.post("/apply-template", json={"messages": history, "tools": [WEATHER]}).json()["prompt"]
    assert "<tool_call>" in prompt and "21 degrees, sunny" in prompt and "get_weather" in prompt
    got = client.chat.completions.create(model="smol", messages=history, tools=[WEATHER], tool_choice="none",
                                         temperature=0, max_tokens=8)
    assert got.choices[0].message.content and not got.choices[0].message.tool_calls


def test_n_choices_whole_and_streamed(main_server):
    """(tests/model/test_choices.py: each choice equals a separate request with its seed, and
    the choices share the prompt's chunks; here drafting is on, so batch makeup may change draws.)"""
    client = main_server.openai(timeout=600)
    msgs = [{"role": "user", "content": "Name a colour."}]
    got = client.chat.completions.create(model="smol", messages=msgs, n=3, seed=11, temperature=1.0, max_tokens=6)
    assert [c.index for c in got.choices] == [0, 1, 2]
    one = client.chat.completions.create(model="smol", messages=msgs, seed=11, temperature=1.0, max_tokens=6)
    assert got.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counted once
    assert got.usage.completion_tokens >= 3  # every choice's tokens
    assert got.usage.total_tokens == got.usage.prompt_tokens + got.usage.completion_tokens
    streamed: dict[int, str] = {}
    for chunk in client.chat.completions.create(model="smol", messages=msgs, n=3, seed=11, temperature=1.0,
                                                max_tokens=6, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
    assert [streamed[i] for i in range(3)] == [c.message.content for c in got.choices]


def test_best_of_is_refused_by_name(main_server):
    with main_server.client() as c:
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "n": 1, "best_of": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"


def test_responses_api_and_a_follow_up_from_the_cache(main_server):
    client = main_server.openai(timeout=600)
    first = client.responses.create(model="smol", input="Name a fruit.", instructions="Answer in one word.",
                                    temperature=0, max_output_tokens=8)
    assert first.status in ("completed", "incomplete") and first.output_text
    # instructions are not carried over (OpenAI's rule): the same ones keep the prompt's prefix
    follow = client.responses.create(model="smol", input="And a vegetable?", previous_response_id=first.id,
                                     instructions="Answer in one word.", temperature=0, max_output_tokens=8)
    assert follow.output_text
    assert follow.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens  # the first turn reused
    text = ""
    kinds = []
    for event in client.responses.create(model="smol", input="Name a fruit.", instructions="Answer in one word.",
                                         temperature=0, max_output_tokens=8, stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert text == first.output_text


def test_responses_function_tools_and_built_in_tools(main_server):
    client = main_server.openai(timeout=600)
    got = client.responses.create(model="smol", input="Weather in Paris?", tool_choice="required", max_output_tokens=80,
                                  temperature=0, tools=[{"type": "function", **WEATHER["function"]}])
    calls = [o for o in got.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["function"]["parameters"])
    with main_server.client() as c:
        r = c.post("/v1/responses", json={"input": "x", "tools": [{"type": "web_search"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].type"


def test_tokenize_detokenize_template_and_props(main_server):
    with main_server.client() as c:
        ids = c.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
        assert c.post("/detokenize", json={"tokens": ids}).json()["content"] == "Hello world"
        vllm = c.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
        assert vllm["tokens"] == ids and vllm["count"] == len(ids) and "".join(vllm["token_strs"]) == "Hello world"
        chat = c.post("/tokenize", json={"messages": ASK}).json()
        r = c.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 1, "temperature": 0}).json()
        assert chat["count"] == r["usage"]["prompt_tokens"]
        props = c.get("/props").json()
        assert props["n_ctx"] == 1024 and props["total_slots"] == 4 and props["chat_template"]
        assert props["tool_call_parser"] == "hermes"


def test_penalties_and_logit_bias_over_http(main_server):
    client = main_server.openai(timeout=600)
    plain = client.completions.create(model="smol", prompt="One, two, three,", temperature=0, max_tokens=6)
    with main_server.client() as c:
        first = c.post("/tokenize", json={"content": plain.choices[0].text}).json()["tokens"][0]
    banned = client.completions.create(model="smol", prompt="One, two, three,", temperature=0, max_tokens=6,
                                       logit_bias={str(first): -100})
    with main_server.client() as c:
        assert c.post("/tokenize", json={"content": banned.choices[0].text}).json()["tokens"][0] != first
    # vllm bench serve sends repetition_penalty 1.0 with every request
    same = client.completions.create(model="smol", prompt="One, two, three,", temperature=0, max_tokens=6,
                                     extra_body={"repetition_penalty": 1.0, "min_tokens": 2})
    assert same.choices[0].text == plain.choices[0].text


def test_anthropic_tools_and_tool_use(main_server):
    client = main_server.anthropic(timeout=600)
    tool = {"name": "get_weather", "description": "The weather in a city",
            "input_schema": WEATHER["function"]["parameters"]}
    got = client.messages.create(model="smol", max_tokens=80, messages=ASK, tools=[tool],
                                 tool_choice={"type": "any"}, extra_body={"temperature": 0})
    uses = [b for b in got.content if b.type == "tool_use"]
    assert got.stop_reason == "tool_use" and uses and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, tool["input_schema"])
    with client.messages.stream(model="smol", max_tokens=80, messages=ASK, tools=[tool],
                                tool_choice={"type": "any"}, extra_body={"temperature": 0}) as stream:
        final = stream.get_final_message()
    assert [b.input for b in final.content if b.type == "tool_use"] == [uses[0].input]
    follow = client.messages.create(model="smol", max_tokens=8, extra_body={"temperature": 0}, tools=[tool], messages=[
        *ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": "get_weather",
                                                 "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "21 degrees"}]}])
    assert follow.content and follow.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_langchain_bind_tools_and_structured_output(main_server):
    langchain_openai = require("langchain_openai")
    llm = langchain_openai.ChatOpenAI(model="smol", base_url=f"{main_server.base_url}/v1",
                                      api_key=main_server.api_key, temperature=0, max_tokens=80, timeout=600)

    class Weather(BaseModel):
        """The weather in a city."""

        city: str = Field(max_length=20)
        unit: Literal["celsius", "fahrenheit"]

    called = llm.bind_tools([Weather], tool_choice="required", strict=True).invoke("What is the weather in Paris?")
    assert called.tool_calls and called.tool_calls[0]["name"] == "Weather"
    Weather.model_validate(called.tool_calls[0]["args"])
    answer = llm.with_structured_output(Weather, method="json_schema").invoke("Weather in Rome, please.")
    assert isinstance(answer, Weather)
