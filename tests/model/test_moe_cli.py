"""`strata generate` with the expert cache: its counters and the budget's split in `--json`
and in the summary line, the split logged once per change, and the flags' errors by name."""

from __future__ import annotations

import json

import pytest

from tests.conftest import require
from tests.model.test_cli_errors import strata
from tests.model.test_moe_parity import tiny_moe_dir

require("transformers")

RUN = ["--prompt", "Hello there", "--raw", "--max-new", "6", "--dtype", "float32", "--max-context", "128",
       "--kv-chunk", "16"]


@pytest.fixture(scope="module")
def olmoe(tmp_path_factory, smol_tokenizer) -> str:
    return tiny_moe_dir("olmoe", tmp_path_factory, smol_tokenizer)


def test_json_and_summary_carry_the_counters(olmoe):
    plain = strata("--model", olmoe, *RUN, "--json")
    cached = strata("--model", olmoe, *RUN, "--json", "--moe-resident", "2", "--moe-evict", "lru",
                    "--kv-resident", "32", "--kv-page", "16", "--device-memory", "512")
    assert plain.returncode == 0 and cached.returncode == 0, cached.stderr[-2000:]
    a, b = json.loads(plain.stdout), json.loads(cached.stdout)
    assert a["token_ids"] == b["token_ids"] and "moe" not in a
    moe = b["moe"]
    assert moe["resident"] == 2 and moe["evict"] == "lru" and moe["misses"] > 0
    assert moe["hits"] + moe["misses"] == moe["runs"] and moe["bytes_copied"] > 0
    assert [layer["layer"] for layer in moe["layers"]] == [0, 1, 2]
    assert moe["budget"]["expert_slots"] == 2 and moe["budget"]["device_bytes"] == 512 * 2**20
    assert moe["tokens"] == b["prompt_tokens"] + b["completion_tokens"] - 1
    assert cached.stderr.count("device budget:") == 1 + moe["budget"]["changes"]
    summary = strata("--model", olmoe, *RUN, "--moe-resident", "2", "--moe-prefetch")
    assert summary.returncode == 0 and "experts 2 slots/layer (lrfu, prefetch), hit " in summary.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--moe-resident", "0"], "--moe-resident must be at least 1"),
    (["--moe-resident", "9"], "--moe-resident 9 is above the model's 8 experts per layer"),
    (["--moe-resident-min", "2"], "--moe-resident-min needs --device-memory"),
    (["--device-memory", "1"], "--device-memory 1 MiB cannot hold the resident weights"),
    (["--moe-evict", "fifo"], "--moe-evict"),
])
def test_bad_flags_name_themselves(olmoe, args, needle):
    run = strata("--model", olmoe, *RUN, *args)
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert needle in run.stderr.strip().splitlines()[-1]
