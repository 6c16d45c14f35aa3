"""A base model without a chat template (as the Gemma 3 270M file): it serves raw prompts
(`/v1/completions`) and refuses messages (chat completions, Anthropic messages) with a 400
that says why, before anything is queued."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from serving import RunningServer, engine_loader, start_server

from strata.server.settings import ServerSettings
from tests.conftest import make_tiny_model


@pytest.fixture(scope="module")
def base_server(tmp_path_factory, smol_tokenizer) -> Iterator[RunningServer]:
    path = make_tiny_model("llama", str(tmp_path_factory.mktemp("tiny-base")), smol_tokenizer)
    config_path = os.path.join(path, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config.pop("chat_template", None)
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    for name in ("chat_template.jinja", "chat_template.json"):
        if os.path.exists(os.path.join(path, name)):
            os.remove(os.path.join(path, name))
    running = start_server(ServerSettings(model_alias="base"), engine_loader(path, dtype="float32", max_context=128),
                           model_id="base")
    yield running
    running.stop()


def test_completions_are_served(base_server):
    with base_server.client() as c:
        r = c.post("/v1/completions", json={"model": "base", "prompt": "Once upon a time", "max_tokens": 4,
                                            "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 4 and body["choices"][0]["text"]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_is_refused_with_a_400_naming_the_missing_template(base_server, stream):
    with base_server.client() as c:
        r = c.post("/v1/chat/completions", json={"model": "base", "messages": [{"role": "user", "content": "Hi"}],
                                                 "max_tokens": 4, "stream": stream})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "no chat template" in error["message"] and error["param"] == "messages"
    assert error["type"] == "invalid_request_error"


def test_anthropic_messages_are_refused_with_a_400(base_server):
    with base_server.client() as c:
        r = c.post("/v1/messages", json={"model": "base", "messages": [{"role": "user", "content": "Hi"}],
                                         "max_tokens": 4})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and "no chat template" in body["error"]["message"]
