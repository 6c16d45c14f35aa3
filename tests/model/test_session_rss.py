"""Restoring a session file holds a few chunks of K/V outside the pool, not the session.

A child process (its own RSS) restores a synthetic session of ~2 GiB of K/V (131,100
cells of 16 KiB: a tiny Llama of 8 layers, 4 K/V heads of 64, float32) into a pool of
2048-cell chunks (32 MiB each); its peak RSS during the restore (VmHWM, reset right before)
stays within 4 chunks of its RSS before. Reading the whole file into memory would add 2 GiB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import make_tiny_model

GIB = 1 << 30


def test_restore_peak_rss_is_a_few_chunks(tmp_path, smol_tokenizer):
    model = make_tiny_model("llama", str(tmp_path / "model"), smol_tokenizer, hidden_size=256, num_attention_heads=4,
                            num_key_value_heads=4, num_hidden_layers=8, intermediate_size=256)
    child = os.path.join(os.path.dirname(__file__), "session_rss_child.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [os.getcwd(), os.environ.get("PYTHONPATH")] if p)}
    out = subprocess.run([sys.executable, child, model, str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(r)
    assert r["file_bytes"] >= 2 * GIB and r["num_cells"] == 131100
    assert r["pattern_ok"]
    assert r["peak"] - r["before"] <= 4 * r["chunk_bytes"], r
