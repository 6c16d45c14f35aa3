"""The short soak: benchmarks/soak.py for about a minute, as CI runs it.

6 clients (2 of them sending near-max-context prompts) against a real `strata serve` child
process with a pool of 1.5 contexts (24 chunks of 32 cells, 4 lanes, --max-waiting 1), so
every pool-full path fires: 503 kv_pool_full and queue_full with Retry-After, truncation
mid-decode, eviction of parked conversations. `--until-paths` keeps the load on (300 s at
most) past the minute until each has fired, so a slow or busy machine gets there too
(on a quiet one they fire within the minute; truncation is the last, as it needs lanes
to decode far enough to fill the pool).

Asserted from the run's JSON: no failure (another status, a broken stream, a hang), every
path fired, no lane busy and every chunk free or parked afterwards, /health 200, no 5xx but
503, RSS flat after warm-up (10 % or 64 MiB: a minute is too short to judge a slow leak;
the long soak in README.md uses 5 % or 48 MiB). Deselect with `-m "not soak"`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 1200  # load 60 s (+300 s at most), requests draining, the server's start

pytestmark = pytest.mark.soak


def test_one_minute_soak(gguf_path, tmp_path):
    out = tmp_path / "soak.json"
    cmd = [
        sys.executable, os.path.join(ROOT, "benchmarks", "soak.py"),
        "--clients", "6", "--big-clients", "2", "--minutes", "1", "--until-paths", "300",
        "--seed", "1", "--model", gguf_path, "--rss-tol", "10", "--rss-tol-mib", "64",
        "--out", str(out), "--no-plot",
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=ROOT)
    report = proc.stdout[-6000:] + "\n" + proc.stderr[-3000:]
    assert out.exists(), f"soak.py wrote no result ({proc.returncode}):\n{report}"
    result = json.loads(out.read_text())
    failed = [c for c in result["checks"] if not c["ok"]]
    assert not failed, f"{failed}\n{report}"
    assert proc.returncode == 0, report

    counts = result["summary"]["by_outcome"]
    assert counts["failure"] == 0 and counts["hangs"] == 0
    assert counts["complete"] > 0 and counts["disconnected"] + counts["truncated"] + counts["refused"] > 0
    assert counts["refused_pool"] > 0 and counts["refused_queue"] > 0 and counts["truncated"] > 0
    server = result["summary"]["server"]
    assert server["evictions"] > 0
    # The server counted every refusal and truncation the clients saw (and maybe more: one
    # that ended while its client was hanging up).
    assert server["refusals"] >= counts["refused_pool"] and server["truncations"] >= counts["truncated"]
    names = {c["name"] for c in result["checks"] if c["ok"]}
    assert {"no lane busy", "every chunk free or parked", "server alive, /health 200"} <= names
