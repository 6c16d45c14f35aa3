"""`strata serve` as users run it: a process of its own, its API key from the real environment
(`STRATA_API_KEY`, no flag), its socket bound by the parent (`--fd`), stopped by SIGTERM while
two streams are open: it exits 0 within a bound, and the engine's last word is that no
request holds a K/V chunk any more.

The engine's steps pass a gate (tests/stepped.py) the test holds while the streams are open,
so they are still open when the signal comes, whatever this machine's speed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx

from tests import stepped
from tests.ports import wait_serving
from tests.stepped import Gate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY = "key-from-the-environment"
STOP_BOUND_S = 60.0  # SIGTERM to exit: uvicorn's 5 s grace for open streams, then the engine stops
STOPPED = re.compile(r"strata: stopped: (\d+) request\(s\) running, (\d+) of (\d+) K/V chunks held by requests")


def open_stream(base: str, start: int, first_token: threading.Event, ended: list) -> threading.Thread:
    """A long greedy stream; `first_token` is set when its first text arrives, and its last
    event (or the exception that ended it) is appended to `ended`."""
    def run() -> None:
        body = {"prompt": list(range(start, start + 12)), "max_tokens": 400, "temperature": 0,
                "ignore_eos": True, "stream": True}
        last = None
        try:
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=300,
                              headers={"Authorization": f"Bearer {KEY}"}) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        last = line[6:]
                        if last != "[DONE]" and json.loads(last).get("choices", [{}])[0].get("text"):
                            first_token.set()
            ended.append(last)
        except httpx.HTTPError as exc:  # the server cut the stream as it stopped
            ended.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_sigterm_with_open_streams_frees_their_chunks_and_exits_0(tiny_llama_dir, tmp_path):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    gate = Gate(str(tmp_path / "gate"))
    args = ["serve", "--fd", str(sock.fileno()), "--model", tiny_llama_dir, "--dtype", "float32",
            "--max-context", "512", "--batch", "1", "--kv-pool-tokens", "1024", "--kv-chunk", "16"]
    env = {**os.environ, "PYTHONPATH": ROOT, "STRATA_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, *stepped.command(gate.path, *args)], env=env, cwd=ROOT,
                            stderr=subprocess.PIPE, text=True, pass_fds=[sock.fileno()])
    sock.close()  # the server holds it now
    try:
        gate.open()
        wait_serving(base, proc, "strata serve")
        # The key came from the environment: every route but /health needs it.
        assert httpx.get(f"{base}/v1/models").status_code == 401
        assert httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        models = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert models.status_code == 200, models.text

        gate.hold()
        first = [threading.Event(), threading.Event()]
        ended: list = []
        streams = [open_stream(base, 1000 + 100 * i, first[i], ended) for i in range(2)]
        for _ in range(20):  # a step at a time until both streams have their first token
            if all(f.is_set() for f in first):
                break
            gate.steps(1)
            first[0].wait(5)
            first[1].wait(5)
        assert all(f.is_set() for f in first), "the streams never started"
        m = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        assert re.search(r"^strata_requests_running 2\.0$", m, re.M), m
        active = float(re.search(r'^strata_kv_chunks\{state="active"\} (\S+)$', m, re.M).group(1))
        assert active >= 2  # each open stream holds its chunks

        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for s in streams:  # uvicorn waits its grace period, then cuts them: no token came meanwhile
            s.join(STOP_BOUND_S)
        assert not any(s.is_alive() for s in streams) and len(ended) == 2
        gate.release()  # the engine thread, waiting at the gate, now takes the stop
        code = proc.wait(STOP_BOUND_S)
        elapsed = time.monotonic() - t0
        err = proc.stderr.read()
        assert code == 0, err
        assert elapsed < STOP_BOUND_S
        stopped = STOPPED.search(err)
        assert stopped, err
        assert (int(stopped.group(1)), int(stopped.group(2)), int(stopped.group(3))) == (0, 0, 1024 // 16)
    finally:
        gate.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
