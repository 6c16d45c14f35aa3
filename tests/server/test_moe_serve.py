"""A tiny OLMoE-shaped GGUF (stacked Q4_K/Q8_0/Q6_K/F16 experts, tests/model/test_moe_gguf.py)
answers through `strata generate` as its transformers twin does (float32, greedy), and a
server on it answers a completion with the same text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from serving import RunningServer, engine_loader, start_server

from strata.server.settings import ServerSettings
from tests.conftest import require
from tests.model import tiny_gguf
from tests.model.test_moe_gguf import FAMILIES, SIZES, VOCAB, twin_from_file, write_file

transformers = require("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "Once upon a time"
NEW = 8


@pytest.fixture(scope="module")
def olmoe(tmp_path_factory, gguf_path):
    _, cls, overrides = FAMILIES["olmoe"]
    torch.manual_seed(41)
    model = transformers.AutoModelForCausalLM.from_config(
        getattr(transformers, cls)(**SIZES, **overrides, vocab_size=VOCAB), dtype=torch.float32)
    path = write_file(model, "olmoe", str(tmp_path_factory.mktemp("moe-serve") / "tiny-olmoe.gguf"),
                      tiny_gguf.tokenizer_fields(gguf_path))
    return path, twin_from_file(model, "olmoe", path)


@pytest.fixture(scope="module")
def generated(olmoe) -> dict:
    path, _ = olmoe
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run(
        [sys.executable, "-m", "strata.cli", "generate", "--model", path, "--prompt", PROMPT, "--raw",
         "--dtype", "float32", "--max-new", str(NEW), "--ignore-eos", "--json"],
        check=False, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def server(olmoe) -> Iterator[RunningServer]:
    running = start_server(ServerSettings(model_alias="olmoe"),
                           engine_loader(olmoe[0], dtype="float32", max_context=128), model_id="olmoe")
    yield running
    running.stop()


def test_strata_generate_answers_like_transformers(olmoe, generated):
    from strata.loader import open_model

    path, twin = olmoe
    ids = open_model(path).tokenizer.encode(PROMPT)
    with torch.inference_mode():
        out = twin.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                            pad_token_id=0)
    assert generated["token_ids"] == out[0, len(ids):].tolist()


def test_a_completion_answers_as_strata_generate(server, generated):
    with server.client() as c:
        r = c.post("/v1/completions", json={"model": "olmoe", "prompt": PROMPT, "max_tokens": NEW,
                                            "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == NEW
    assert body["choices"][0]["text"] == generated["text"]
