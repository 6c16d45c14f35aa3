"""Run by test_session_crash.py in its own process, which kills it with SIGKILL when it prints
"held": a save (or a restore) of a session file stopped after its second record.

argv: model_dir, directory, mode ("save" or "restore"). Save: answers a prompt, saves
`chat.bin` whole (printing its SHA-256), answers a follow-up, then saves the longer
conversation over `chat.bin` and holds. Restore: restores `chat.bin` and holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.engine.outputs import collect
from strata.sampling import SamplingParams

PROMPT = list(range(1000, 1040))
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def hold(i: int) -> None:
    if i == 1:
        print("held", flush=True)
        threading.Event().wait()  # until the parent kills this process


def main(model_dir: str, directory: str, mode: str) -> None:
    engine = Engine(EngineConfig(model=model_dir, dtype="float32", max_context=256, batch=1, kv_pool_tokens=512,
                                 kv_chunk=16, spec="off"), progress=False)
    path = os.path.join(directory, "chat.bin")
    if mode == "save":
        history = PROMPT + collect(engine.stream(engine.submit(PROMPT, GREEDY))).token_ids
        engine.save_session(path, token_ids=history)
        with open(path, "rb") as f:
            print(json.dumps({"sha256": hashlib.sha256(f.read()).hexdigest(), "cells": len(history) - 1}), flush=True)
        longer = history + list(range(2000, 2020))
        longer += collect(engine.stream(engine.submit(longer, GREEDY))).token_ids
        engine._sessions.wait(engine.begin_save_session(path, token_ids=longer, on_record=hold))
    else:
        engine._sessions.wait(engine.begin_restore_session(path, on_record=hold))
    raise SystemExit("the stream was never held")


if __name__ == "__main__":
    main(*sys.argv[1:4])
