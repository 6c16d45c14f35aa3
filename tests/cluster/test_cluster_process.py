"""`strata cluster` as users run it: its own process starting its own local Ray cluster, one
replica of a tiny float32 model, one chat through the real `openai` client (the model's own
greedy answer), then SIGTERM: it exits 0 within a bound and leaves none of the processes it
started (Ray's included) behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.conftest import require
from tests.ports import held_port, wait_serving

openai = require("openai")
psutil = require("psutil")
require("ray.serve")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READY_S = 600.0  # Ray's start and the replica's load on a busy 2-core machine
STOP_BOUND_S = 120.0  # SIGTERM to exit: Serve's and Ray's shutdown
CHAT = [{"role": "user", "content": "Name a colour."}]


def test_one_chat_then_sigterm_stops_everything_it_started(tiny_llama_dir):
    from strata import LLM, SamplingParams

    expected = LLM(model=tiny_llama_dir, dtype="float32", max_context=256, batch=0).chat(
        CHAT, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].text
    with held_port() as port:  # Serve's proxy binds it beside this socket (tests/ports.py)
        args = ["cluster", "--ray", "local", "--replicas", "1", "--threads", "1", "--port", str(port),
                "--model", tiny_llama_dir, "--dtype", "float32", "--max-context", "256", "--batch", "1",
                "--model-alias", "tiny"]
        env = {**os.environ, "PYTHONPATH": ROOT}
        proc = subprocess.Popen([sys.executable, "-m", "strata.cli", *args], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # its own group: whatever it leaves is found below
        base = f"http://127.0.0.1:{port}"
        try:
            wait_serving(base, proc, "strata cluster", "/v1/models", READY_S)
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120)
            raw = client.chat.completions.with_raw_response.create(
                model="tiny", messages=CHAT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
            assert raw.parse().choices[0].message.content == expected
            assert raw.headers["x-strata-replica"]
            started = psutil.Process(proc.pid).children(recursive=True)
            assert started  # Ray's processes: the command started its own cluster
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(STOP_BOUND_S)
            err = proc.stderr.read()
            assert code == 0, err
            assert time.monotonic() - t0 < STOP_BOUND_S
            assert "strata: cluster stopped" in err
            gone_by = time.monotonic() + 30  # the last of Ray's workers may take a moment after the driver
            while alive := [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]:
                assert time.monotonic() < gone_by, f"left running: {[p.cmdline()[:3] for p in alive]}"
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
            try:  # anything of its process group still there (a failed run): ended, by the group's id
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
