"""The real Gemma 3 270M Q4_K_M file against transformers loading the same GGUF, in float32.

Greedy continuations token for token: a short prompt, and one longer than the file's
512-cell window (its sliding layers then read only the last 512 cells), through the
engine and through `strata generate` (with --raw and without: the file has no chat
template). Slow (transformers dequantises the whole file): one transformers model for the
module, few prompts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from strata.llm import LLM
from strata.sampling import SamplingParams
from tests.conftest import require

transformers = require("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NEW = 16
CAPITAL = "The capital of France is"
WINDOW = 512


def long_text() -> str:
    """About 700 tokens of varied sentences (no one sentence repeats)."""
    things = ["river", "mountain", "library", "harbour", "orchard", "bridge", "market", "castle", "forest", "station"]
    verbs = ["opened", "flooded", "burned", "grew", "closed", "moved", "shone", "fell", "rose", "waited"]
    days = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
    lines = [f"In year {1700 + 7 * i}, the {things[i % 10]} near {things[(i * 3 + 1) % 10]} town "
             f"{verbs[(i * 7) % 10]} on a {days[i % 7]}, and {i * 13 % 97} people saw it."
             for i in range(26)]
    return " ".join(lines) + " Looking back on all of this, the historian concluded that"


@pytest.fixture(scope="module")
def gemma3(gemma3_path):
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gemma3_path), gguf_file=os.path.basename(gemma3_path), dtype=torch.float32).eval()
    llm = LLM(model=gemma3_path, dtype="float32", max_context=1024, batch=1, progress=False)
    return ref, llm


def greedy_reference(ref, ids: list[int]) -> list[int]:
    with torch.inference_mode():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_the_file_is_read_as_gemma3_with_its_windows(gemma3):
    cfg = gemma3[1].engine._runner.model.cfg
    assert cfg.arch == "gemma3_text" and cfg.num_layers == 18
    assert cfg.layer_windows == tuple(None if (i + 1) % 6 == 0 else WINDOW for i in range(18))
    assert (cfg.rope_theta, cfg.rope_local_theta) == (1_000_000.0, 10_000.0)


@pytest.mark.parametrize("text", ["capital", "long"])
def test_greedy_continuations_match_transformers(gemma3, text):
    ref, llm = gemma3
    ids = llm.tokenizer.encode(CAPITAL if text == "capital" else long_text())
    if text == "long":
        assert WINDOW < len(ids) < 1024 - NEW
    (got,) = llm.generate([ids], SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True))
    assert list(got.token_ids) == greedy_reference(ref, ids)


@pytest.mark.parametrize("raw", [True, False])
def test_strata_generate_answers_like_transformers(gemma3, gemma3_path, raw):
    """With --raw, and without: the file has no chat template, so --prompt alone is its raw
    prompt (the command says so)."""
    ref, llm = gemma3
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run(
        [sys.executable, "-m", "strata.cli", "generate", "--model", gemma3_path, "--prompt", CAPITAL,
         *(["--raw"] if raw else []), "--dtype", "float32", "--max-new", str(NEW), "--ignore-eos", "--json"],
        check=False, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    assert ("no chat template" in run.stderr) == (not raw), run.stderr[-2000:]
    result = json.loads(run.stdout)
    expected = greedy_reference(ref, llm.tokenizer.encode(CAPITAL))
    assert result["token_ids"] == expected


def several_windows() -> str:
    """About 2060 tokens: the long text three times over, each time numbered apart."""
    return " ".join(f"Part {n}. {long_text()}" for n in ("one", "two", "three"))


def test_layer_groups_answer_like_keep_everything_and_transformers(gemma3):
    """A prompt several windows long through the pool's layer groups (each sliding layer holding
    only its window, docs/windows.md) gives the tokens of the reserved layout, which keeps every
    cell, and of transformers; the windowed group never held more than its bound."""
    ref, _ = gemma3
    ctx, chunk = 2560, 128
    grouped = LLM(model=gemma3[1].engine.config.model, dtype="float32",
                  max_context=ctx, batch=0, kv_pool_tokens=ctx + chunk, kv_chunk=chunk, progress=False)
    keep = LLM(model=gemma3[1].engine.config.model, dtype="float32", max_context=ctx, batch=0,
               kv_chunk=chunk, progress=False)
    ids = grouped.tokenizer.encode(several_windows())
    assert 3 * WINDOW < len(ids) < ctx - NEW
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    (a,) = grouped.generate([ids], params)
    (b,) = keep.generate([ids], params)
    layout = grouped.engine._layout
    assert layout.windows == (WINDOW,)
    (conv,) = list(grouped.engine._scheduler.cache)
    assert len(conv.table.windows[0].held) <= WINDOW // chunk + 1 < len(conv.table.chunk_ids)
    assert list(a.token_ids) == list(b.token_ids) == greedy_reference(ref, ids)
