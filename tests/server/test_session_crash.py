"""Crash safety of session files: a process killed with SIGKILL in the middle of a save, then in
the middle of a restore (tests/server/session_crash_child.py, held after its second record),
and a fresh server on the directory.

- The save killed mid-file leaves the previous `chat.bin` byte for byte, and its temporary file.
- The restore killed mid-file changes no file.
- A fresh server says once that it removed the temporary file, removes nothing else (files
  that only resemble its temporary names stay), restores `chat.bin`, and a follow-up reuses it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys

import httpx
from serving import engine_loader, start_server

from strata.kv.session_disk import is_leftover
from strata.server.settings import ServerSettings

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "session_crash_child.py")
DECOYS = [".chat.bin.tmp", ".chat.bin.ABCDEFGH.strata-tmp", ".chat.bin.abcdefgh.strata-tmp.keep", "notes.strata-tmp"]


def killed_when_held(model_dir: str, directory: str, mode: str) -> list[str]:
    """Runs the child until it holds its stream, kills it with SIGKILL; returns what it printed first."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, CHILD, model_dir, directory, mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    try:
        for line in proc.stdout:
            if line.strip() == "held":
                break
            lines.append(line.strip())
        else:
            raise AssertionError(f"the child ended before holding: {proc.stderr.read()[-2000:]}")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
    return lines


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_kill_during_save_and_restore_then_a_fresh_server(tiny_llama_dir, tmp_path, caplog):
    directory = str(tmp_path)
    for name in DECOYS:
        with open(os.path.join(directory, name), "w") as f:
            f.write("not strata's")
    first = json.loads(killed_when_held(tiny_llama_dir, directory, "save")[-1])
    path = os.path.join(directory, "chat.bin")
    assert digest(path) == first["sha256"]  # the previous file, whole
    leftovers = [n for n in os.listdir(directory) if is_leftover(n)]
    assert len(leftovers) == 1 and leftovers[0].startswith(".chat.bin."), os.listdir(directory)

    listing = sorted(os.listdir(directory))
    killed_when_held(tiny_llama_dir, directory, "restore")
    assert sorted(os.listdir(directory)) == listing and digest(path) == first["sha256"]

    with caplog.at_level(logging.WARNING, logger="strata"):
        running = start_server(ServerSettings(slot_save_path=directory),
                               engine_loader(tiny_llama_dir, dtype="float32", max_context=256, batch=1,
                                             kv_pool_tokens=512, kv_chunk=16, spec="off"))
    try:
        said = [r.getMessage() for r in caplog.records if "temporary session file" in r.getMessage()]
        assert len(said) == 1 and leftovers[0] in said[0], said
        assert sorted(os.listdir(directory)) == sorted(["chat.bin", *DECOYS])
        r = httpx.post(f"{running.base_url}/slots/1", params={"action": "restore"}, json={"filename": "chat.bin"},
                       timeout=120)
        assert r.status_code == 200 and r.json()["n_restored"] == first["cells"], r.text
        with open(path, "rb") as f:
            from strata.kv.session_format import read_header

            history = read_header(f, path)[0].token_ids
        r = httpx.post(f"{running.base_url}/v1/completions", timeout=120,
                       json={"prompt": history + [3000, 3001], "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == len(history)
    finally:
        running.stop()
