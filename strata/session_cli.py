"""`strata session save|restore|inspect|verify`: session files from the command line.

- `save FILE --prompt ...`: answers the prompt (greedy), then saves the conversation;
- `restore FILE [--prompt ...]`: restores it and, with raw text that continues it, answers
  reusing every restored cell (`cached_tokens`);
- `inspect FILE`: the header (no model needed);
- `verify FILE`: every record's checksum (no model needed).
Each prints one JSON object; an error is one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from strata.engine_args import add_engine_args, engine_config
from strata.errors import ConfigError
from strata.cells.session import SessionReader


def add_session_parser(subparsers: argparse._SubParsersAction) -> None:
    s = subparsers.add_parser("session", help="save, restore, inspect or verify a session file")
    sub = s.add_subparsers(dest="session_command", required=True)
    save = sub.add_parser("save", help="answer a prompt, then save the conversation to FILE")
    restore = sub.add_parser("restore", help="restore FILE, then answer a follow-up that extends it")
    for p in (save, restore):
        p.add_argument("file", help="the session file")
        p.add_argument("--max-new", type=int, default=64, help="new tokens at most (greedy)")
        add_engine_args(p)
    save.add_argument("--prompt", "-p", default=None, help="the user message the conversation starts with")
    save.add_argument("--system", default=None, help="a system message")
    restore.add_argument("--prompt", "-p", default=None,
                         help="raw text that continues the restored tokens (no chat template is applied)")
    save.set_defaults(func=cmd_save)
    restore.set_defaults(func=cmd_restore)
    inspect = sub.add_parser("inspect", help="print FILE's header")
    inspect.add_argument("file")
    inspect.add_argument("--tokens", action="store_true", help="print every token id too")
    inspect.set_defaults(func=cmd_inspect)
    verify = sub.add_parser("verify", help="check every checksum of FILE")
    verify.add_argument("file")
    verify.set_defaults(func=cmd_verify)


def _answer(engine, prompt_ids: list[int], max_new: int) -> tuple[list[int], str, int]:
    from strata.engine.interface import collect
    from strata.sampling import SamplingParams

    if max_new < 1:
        raise ConfigError(f"--max-new must be at least 1, got {max_new}")
    request_id = engine.submit(prompt_ids, SamplingParams(temperature=0, max_tokens=max_new))
    got = collect(engine.stream(request_id))
    return got.token_ids, got.text, got.final.num_cached_tokens


def _print(result: dict) -> int:
    print(json.dumps(result, ensure_ascii=False))
    return 0


def cmd_save(args: argparse.Namespace) -> int:
    from strata.engine.interface import Engine

    if not args.prompt:
        raise ConfigError("--prompt is required: the conversation to save starts with it")
    engine = Engine(engine_config(args), progress=sys.stderr.isatty())
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}]
    prompt_ids = engine.tokenizer.encode_chat(messages)
    tokens, text, _ = _answer(engine, prompt_ids, args.max_new)
    saved = engine.save_session(args.file, token_ids=prompt_ids + tokens)
    return _print({"filename": args.file, "text": text, "n_saved": saved.num_cells, "n_written": saved.num_bytes,
                   "timings": {"save_ms": round(saved.seconds * 1e3, 3)}})


def cmd_restore(args: argparse.Namespace) -> int:
    from strata.engine.interface import Engine

    engine = Engine(engine_config(args), progress=sys.stderr.isatty())
    restored = engine.restore_session(args.file)
    result = {"filename": args.file, "n_restored": restored.num_cells, "n_read": restored.num_bytes,
              "timings": {"restore_ms": round(restored.seconds * 1e3, 3)}}
    if args.prompt:
        # The follow-up goes on from the restored tokens as is: raw text (special-token
        # spellings such as "<|im_start|>" become their ids), no chat template is applied.
        history = list(restored.token_ids)
        follow_up = engine.tokenizer.encode(args.prompt, add_special_tokens=False)
        tokens, text, cached = _answer(engine, history + follow_up, args.max_new)
        result.update(text=text, cached_tokens=cached, prompt_tokens=len(history) + len(follow_up))
    return _print(result)


def cmd_inspect(args: argparse.Namespace) -> int:
    with SessionReader.open(args.file) as reader:
        h = reader.header
        out = {"filename": args.file, "format_version": h.version, "fingerprint": h.fingerprint,
               "geometry": dataclasses.asdict(h.geometry), "bytes_per_cell": h.geometry.bytes_per_cell,
               "block_cells": h.block_cells, "n_cells": h.num_cells, "n_records": h.num_records,
               "checkpoints": h.checkpoints, "file_bytes": reader.num_bytes, "kv_bytes": h.kv_bytes(),
               "metadata": h.metadata}
        if h.groups:  # version 2: the layer groups, each one's cells (docs/sessions.md)
            out["groups"] = [{"window": g.window, "layers": list(g.layers), "spans": [list(x) for x in g.spans],
                              "n_cells": g.num_cells} for g in h.groups]
            out["windows_kept"] = h.windows_kept
        out["token_ids"] = h.token_ids if args.tokens else h.token_ids[:16]
    return _print(out)


def cmd_verify(args: argparse.Namespace) -> int:
    with SessionReader.open(args.file) as reader:
        reader.verify()
        return _print({"filename": args.file, "ok": True, "n_records": reader.header.num_records,
                       "n_read": reader.num_bytes})
