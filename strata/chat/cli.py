"""`strata chat`: its flags, and the command that loads the engine and runs the loop."""

from __future__ import annotations

import argparse
import sys

from strata.engine_args import add_engine_args, engine_config
from strata.errors import ConfigError, RequestError

SAMPLING_FLAGS = {
    "max_tokens": "--max-new", "temperature": "--temperature", "top_k": "--top-k",
    "top_p": "--top-p", "min_p": "--min-p", "seed": "--seed",
}


def add_chat_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("chat", help="a terminal chat (multi-turn over the conversation cache)")
    c.add_argument("--system", default=None, help="the system prompt (/system changes it)")
    c.add_argument("--max-new", type=int, default=512, help="new tokens per answer at most")
    c.add_argument("--temperature", type=float, default=0.7, help="0 is greedy")
    c.add_argument("--top-k", type=int, default=0)
    c.add_argument("--top-p", type=float, default=1.0)
    c.add_argument("--min-p", type=float, default=0.0)
    c.add_argument("--seed", type=int, default=None, help="answer i samples with seed + i")
    add_engine_args(c)
    c.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    from strata.chat.history import ChatHistory
    from strata.chat.repl import ChatRepl
    from strata.engine.interface import Engine
    from strata.sampling import SamplingParams

    try:
        params = SamplingParams(
            max_tokens=args.max_new, temperature=args.temperature, top_k=args.top_k,
            top_p=args.top_p, min_p=args.min_p, seed=args.seed,
        )
    except RequestError as exc:  # name the flag the user typed, not the API field
        raise ConfigError(f"{SAMPLING_FLAGS.get(exc.param or '', exc.param)}: {exc}") from exc
    if args.system == "":
        raise ConfigError("--system is empty: give the system prompt, or leave the flag out")
    config = engine_config(args)
    if sys.stdin.isatty():
        import readline  # noqa: F401 - line editing and history for input()
    engine = Engine(config, progress=sys.stderr.isatty())
    return ChatRepl(engine, params, ChatHistory(system=args.system)).run()
