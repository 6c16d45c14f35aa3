"""The `strata` command: `strata generate` (one shot), `strata chat` (a terminal chat),
`strata serve` (OpenAI and Anthropic HTTP) and `strata session` (session files)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from strata.engine_args import add_engine_args, engine_config
from strata.errors import ConfigError, RequestError, StrataError
from strata.chat.cli import add_chat_parser
from strata.cluster.cli import add_cluster_parser
from strata.server.cli import add_serve_parser
from strata.session_cli import add_session_parser

MIB = 1 << 20
SAMPLING_FLAGS = {
    "max_tokens": "--max-new", "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
    "min_p": "--min-p", "seed": "--seed", "stop": "--stop",
}


def _messages(args: argparse.Namespace) -> list[dict] | None:
    if args.messages:
        try:
            with open(args.messages, encoding="utf-8") as f:
                messages = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"--messages {args.messages}: {exc}") from exc
        if not isinstance(messages, list):
            raise ConfigError(f"--messages {args.messages}: expected a JSON list of messages")
        return messages
    if args.raw:
        return None
    messages = [{"role": "system", "content": args.system}] if args.system else []
    return messages + [{"role": "user", "content": args.prompt}]


def cmd_generate(args: argparse.Namespace) -> int:
    from strata.engine.interface import Engine, collect
    from strata.sampling import SamplingParams

    if not args.messages and args.prompt is None:
        raise ConfigError("--prompt is required (or --messages FILE)")
    if args.raw and args.prompt is None:
        raise ConfigError("--raw needs --prompt")
    if not args.messages and args.prompt == "":
        raise ConfigError("--prompt is empty: give the text to answer (or --messages FILE)")
    try:
        params = SamplingParams(
            max_tokens=args.max_new, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            min_p=args.min_p, seed=args.seed, stop=tuple(args.stop or ()), ignore_eos=args.ignore_eos,
        )
    except RequestError as exc:  # name the flag the user typed, not the API field
        flag = SAMPLING_FLAGS.get(exc.param or "", exc.param)
        raise ConfigError(f"{flag}: {exc}") from exc
    config = engine_config(args)
    messages = _messages(args)  # a bad --messages file is a flag error: before the model loads
    t0 = time.perf_counter()
    engine = Engine(config, progress=sys.stderr.isatty())
    load_s = time.perf_counter() - t0
    if messages is not None and engine.tokenizer.chat_template is None and not (args.messages or args.system):
        # A base model (no chat template): --prompt alone is its raw prompt, as with --raw.
        print("strata generate: this model has no chat template: --prompt is used as a raw prompt",
              file=sys.stderr)
        messages = None
    prompt = args.prompt if messages is None else engine.tokenizer.encode_chat(messages)
    request_id = engine.submit(prompt, params)
    got = collect(engine.stream(request_id), None if args.json else _write)
    final, snap = got.final, engine.snapshot()
    t = final.timings
    result = {
        "text": got.text, "token_ids": got.token_ids, "finish_reason": final.finish_reason,
        "truncated": final.truncated, "prompt_tokens": final.num_prompt_tokens,
        "completion_tokens": len(got.token_ids), "ttft_ms": round(t.prompt_ms, 2),
        "prefill_tok_s": round(t.prompt_per_second, 2), "decode_tok_s": round(t.predicted_per_second, 2),
        "kv_bytes_held": snap.kv_bytes_held, "load_s": round(load_s, 3), "timings": t.as_dict(),
        "kernels": dict(engine.info.kernels),
    }
    spec = None
    if snap.spec is not None:
        c = snap.spec
        spec = {"drafted": c.num_drafted, "accepted": c.num_accepted, "verify_steps": c.num_steps}
        result["spec"] = spec
    ring = None
    if snap.ring is not None:
        ring = {**snap.ring, **(snap.lanes[0].ring or {})}
        result["ring"] = ring
    if snap.moe is not None:
        result["moe"] = snap.moe
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        print(
            f"[prompt {final.num_prompt_tokens} tok | TTFT {t.prompt_ms:.0f} ms | prefill "
            f"{t.prompt_per_second:.1f} tok/s | decode {t.predicted_per_second:.1f} tok/s ({len(got.token_ids)} tok) | "
            f"K/V held {snap.kv_bytes_held / MIB:.1f} MiB | "
            + (_ring_summary(ring) if ring else "") + (_spec_summary(spec) if spec else "")
            + (_moe_summary(snap.moe) if snap.moe else "")
            + f"{final.finish_reason}]",
            file=sys.stderr,
        )
    return 0


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _ring_summary(ring: dict) -> str:
    return (f"ring {ring['ring_cells']} cells, {ring['resident_pages']} pages resident, "
            f"{ring['bytes_streamed_per_token'] / MIB:.2f} MiB streamed/tok, hit {ring['hit_ratio']:.0%} | ")


def _moe_summary(moe: dict) -> str:
    budget = moe["budget"]
    split = (f", budget {budget['expert_slots']} slots + {budget['ring_bytes'] / MIB:.0f} MiB ring of "
             f"{budget['device_bytes'] / MIB:.0f} MiB") if budget else ""
    return (f"experts {moe['resident']} slots/layer ({moe['evict']}{', prefetch' if moe['prefetch'] else ''}), "
            f"hit {moe['hit_ratio']:.0%}, {moe['misses_per_token']:.1f} misses/tok, "
            f"{moe['bytes_copied_per_token'] / MIB:.2f} MiB copied/tok{split} | ")


def _spec_summary(spec: dict) -> str:
    rate = spec["accepted"] / spec["drafted"] if spec["drafted"] else 0.0
    return f"drafts {spec['accepted']}/{spec['drafted']} kept ({rate:.0%}) | "


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata", description="LLM inference with one shared, chunked KV pool")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate once from a prompt or a chat")
    g.add_argument("--prompt", "-p", default=None, help="the user message (or the raw prompt with --raw)")
    g.add_argument("--system", default=None, help="a system message")
    g.add_argument("--messages", default=None, help="a JSON file holding a list of chat messages")
    g.add_argument("--raw", action="store_true", help="use --prompt as-is, without the chat template")
    g.add_argument("--max-new", type=int, default=256, help="new tokens at most")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", help="a stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    g.add_argument("--json", action="store_true", help="print one JSON result instead of streaming text")
    add_engine_args(g)
    g.set_defaults(func=cmd_generate)
    add_chat_parser(sub)
    add_serve_parser(sub)
    add_cluster_parser(sub)
    add_session_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="strata: %(message)s")
    logging.getLogger("strata.ring").setLevel(logging.INFO)  # each ring sizing is shown (DESIGN.md)
    logging.getLogger("strata.budget").setLevel(logging.INFO)  # each change of the device budget's split
    logging.getLogger("strata.groups").setLevel(logging.INFO)  # the sliding-window layer groups' sizing
    try:
        return args.func(args)
    except StrataError as exc:
        print(f"strata: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
