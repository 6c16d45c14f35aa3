"""The real `strata generate` command in subprocesses: bad input fails clearly, good runs report.

Every bad input must end with a non-zero exit and one clear line on stderr that names the
problem (the flag, for a bad flag value), never a traceback. Flag errors are caught before
the model loads, so those runs cost only the interpreter start. All runs are started
together from one module fixture: most of their time is importing torch.

Text is asserted only in float32: in bfloat16 the default model's answer to QUESTION is a
near-tie that another CPU's bf16 kernels (AMX on Sapphire Rapids) flip ("L'Étoile, la Mar"
instead of Paris), so the run at the default dtype is checked for its structure only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.conftest import require_default_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUESTION = "What is the capital of France?"
LONG = " ".join(["The quick brown fox jumps over the lazy dog."] * 8)
GOOD = ["--prompt", QUESTION, "--max-new", "8", "--max-context", "1024", "--kv-chunk", "256"]
KV_VALUES_PER_CELL = 30 * 2 * 3 * 64  # SmolLM2-135M: layers * (K, V) * kv heads * head dim
KV_BYTES_PER_CELL = {"float32": KV_VALUES_PER_CELL * 4, "bfloat16": KV_VALUES_PER_CELL * 2}  # K/V follows --dtype
F32 = ["--dtype", "float32"]
# The runs that load the model: name -> (arguments, compute dtype). Text is asserted only in float32.
GOOD_RUNS = {"json": (GOOD + F32 + ["--json"], "float32"), "stream": (GOOD + F32, "float32"),
             "json-default-dtype": (GOOD + ["--json"], "bfloat16")}


def strata(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The finished run, with `wall_s`: its wall time measured here, around the process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "strata.cli", "generate", *args], check=False,
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
    run.wall_s = time.perf_counter() - t0
    return run


def bad_inputs(tmp: str) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (arguments, what stderr must say)."""
    corrupt = os.path.join(tmp, "corrupt.gguf")
    with open(corrupt, "wb") as f:
        f.write(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    missing = os.path.join(tmp, "no-such-model.gguf")
    bad_json = os.path.join(tmp, "bad.json")
    with open(bad_json, "w") as f:
        f.write("[{not json")
    not_a_list = os.path.join(tmp, "dict.json")
    with open(not_a_list, "w") as f:
        json.dump({"role": "user", "content": "hi"}, f)
    no_messages = os.path.join(tmp, "no-such-messages.json")
    p = ["--prompt", QUESTION]
    return {
        "empty-prompt": (["--prompt", ""], ["--prompt", "empty"]),
        "prompt-over-max-context": (["--prompt", LONG, "--max-context", "16"],
                                    ["--max-context 16", "tokens"]),  # and the count: see below
        "kv-chunk-0": (p + ["--kv-chunk", "0"], ["--kv-chunk", "at least 1", "0"]),
        "dtype-float8": (p + ["--dtype", "float8"], ["--dtype", "'float8'"]),
        "kv-int4": (p + ["--kv", "int4"], ["--kv", "'int4'"]),
        "batch-negative": (p + ["--batch", "-1"], ["--batch", "at least 0", "-1"]),
        "kv-pool-too-small": (p + ["--max-context", "1024", "--kv-chunk", "256", "--kv-pool-tokens", "300"],
                              ["--kv-pool-tokens 300", "--max-context 1024", "smallest valid value is 1024"]),
        # Without --max-context the model's trained length (8192) decides, once its metadata is read.
        "kv-pool-too-small-trained-length": (p + ["--kv-pool-tokens", "100"],
                                             ["--kv-pool-tokens 100", "smallest valid value is 8192"]),
        "devices-tpu": (p + ["--devices", "tpu"], ["--devices", "'tpu'"]),
        "max-context-1": (p + ["--max-context", "1"], ["--max-context", "at least 2", "1"]),
        "corrupt-gguf": (p + ["--model", corrupt], [corrupt, "GGUF"]),
        "missing-model": (p + ["--model", missing], [missing, "not found"]),
        "messages-bad-json": (["--messages", bad_json], ["--messages", bad_json]),
        # A bad --messages file is a flag error: reported before the model is even looked at.
        "messages-missing": (["--messages", no_messages, "--model", missing], ["--messages", no_messages]),
        "messages-not-a-list": (["--messages", not_a_list, "--model", missing], ["--messages", "list"]),
    }


FLAG_ERRORS = {"kv-chunk-0", "dtype-float8", "kv-int4", "batch-negative", "kv-pool-too-small",
               "kv-pool-too-small-trained-length", "devices-tpu", "max-context-1", "empty-prompt",
               "messages-missing", "messages-bad-json", "messages-not-a-list"}
BAD_NAMES = sorted(FLAG_ERRORS | {"prompt-over-max-context", "corrupt-gguf", "missing-model"})


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    require_default_model()
    bad = bad_inputs(str(tmp_path_factory.mktemp("cli")))
    assert set(bad) == set(BAD_NAMES)
    jobs = {name: args for name, (args, _) in bad.items()}
    jobs.update({name: args for name, (args, _) in GOOD_RUNS.items()})
    with ThreadPoolExecutor(max_workers=4) as pool:
        # The runs that load the model go first, so they overlap the cheap ones.
        first = [*GOOD_RUNS, "prompt-over-max-context"]
        order = first + sorted(set(jobs) - set(first))
        futures = {name: pool.submit(strata, *jobs[name]) for name in order}
        results = {name: f.result() for name, f in futures.items()}
    results["_expect"] = {name: needles for name, (_, needles) in bad.items()}
    return results


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_input_fails_clearly(name, runs):
    run = runs[name]
    assert run.returncode != 0, f"{name}: exit 0\nstdout: {run.stdout[-500:]}\nstderr: {run.stderr[-500:]}"
    assert "Traceback" not in run.stderr, run.stderr
    assert run.stdout == "", run.stdout
    message = run.stderr.strip().splitlines()[-1]
    assert message.startswith(("strata: error:", "strata generate: error:")), run.stderr
    for needle in runs["_expect"][name]:
        assert needle in message, f"{needle!r} not in {message!r}"
    if name in FLAG_ERRORS:
        assert run.returncode == 2  # a usage error, as argparse exits on its own


def test_prompt_over_max_context_says_both_numbers(runs):
    message = runs["prompt-over-max-context"].stderr.strip().splitlines()[-1]
    found = re.search(r"the prompt has (\d+) tokens, more than --max-context 16", message)
    assert found, message
    assert int(found.group(1)) > 16


def test_json_run_in_float32_names_paris(runs):
    result = json.loads(runs["json"].stdout)
    assert "Paris" in result["text"], result["text"]


@pytest.mark.parametrize("name", ["json", "json-default-dtype"])
def test_json_run_reports_every_field(runs, name):
    """Structure only (any dtype): every field, its type, and the counts agree."""
    run = runs[name]
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1, run.stdout
    result = json.loads(lines[0])
    assert isinstance(result["text"], str)
    tokens = result["token_ids"]
    assert 1 <= len(tokens) <= 8 and all(isinstance(t, int) for t in tokens)
    assert result["completion_tokens"] == len(tokens)
    assert result["finish_reason"] in ("stop", "length")
    assert result["finish_reason"] == "length" or tokens[-1] == 2  # SmolLM2's <|im_end|>
    assert result["truncated"] is False
    assert isinstance(result["prompt_tokens"], int) and result["prompt_tokens"] > 16
    assert result["ttft_ms"] > 0 and result["prefill_tok_s"] > 0 and result["decode_tok_s"] > 0
    # No pool: the one lane reserves its whole --max-context, 1024 cells of K/V in the run's dtype.
    assert result["kv_bytes_held"] == 1024 * KV_BYTES_PER_CELL[GOOD_RUNS[name][1]]
    timings = result["timings"]
    # --spec ngram by default: the drafts in llama.cpp's names too
    assert set(timings) == {"cache_n", "prompt_n", "prompt_ms", "prompt_per_second", "predicted_n",
                            "predicted_ms", "predicted_per_second", "draft_n", "draft_n_accepted"}
    assert result["spec"]["drafted"] == timings["draft_n"] >= timings["draft_n_accepted"] == result["spec"]["accepted"]
    assert timings["cache_n"] == 0 and timings["prompt_n"] == result["prompt_tokens"]
    assert timings["predicted_n"] == len(tokens)
    # Each speed from the count and the time printed beside it (tok/s = n / ms x 1000) ...
    assert timings["prompt_per_second"] == pytest.approx(timings["prompt_n"] / timings["prompt_ms"] * 1e3, rel=1e-3)
    assert timings["predicted_per_second"] == pytest.approx(len(tokens) / timings["predicted_ms"] * 1e3, rel=1e-3)
    assert result["prefill_tok_s"] == pytest.approx(result["prompt_tokens"] / result["ttft_ms"] * 1e3, rel=1e-2)
    assert result["decode_tok_s"] == pytest.approx(len(tokens) / timings["predicted_ms"] * 1e3, rel=1e-2)
    # ... and the times within the run's own wall time, measured around the process.
    assert 0 < result["load_s"] * 1e3 + result["ttft_ms"] + timings["predicted_ms"] < run.wall_s * 1e3


def test_streaming_run_prints_text_then_a_summary(runs):
    run, result = runs["stream"], json.loads(runs["json"].stdout)
    assert run.returncode == 0, run.stderr
    assert run.stdout == result["text"] + "\n"  # greedy, both float32: the same text as the JSON run
    summary = run.stderr.strip().splitlines()[-1]
    pattern = (r"\[prompt (\d+) tok \| TTFT \d+ ms \| prefill [\d.]+ tok/s \| decode [\d.]+ tok/s "
               r"\((\d+) tok\) \| K/V held ([\d.]+) MiB \| drafts (\d+)/(\d+) kept \(\d+%\) \| (stop|length)\]")
    found = re.fullmatch(pattern, summary)
    assert found, summary
    assert int(found.group(1)) == result["prompt_tokens"]
    assert int(found.group(2)) == len(result["token_ids"])
    assert float(found.group(3)) == pytest.approx(1024 * KV_BYTES_PER_CELL["float32"] / 2**20, abs=0.05)
    assert (int(found.group(4)), int(found.group(5))) == (result["spec"]["accepted"], result["spec"]["drafted"])
    assert found.group(6) == result["finish_reason"]
