"""The clients: each runs conversations back to back until the deadline.

A plain client picks, turn by turn: a new chat (a prompt from a few words to most of the
context), a follow-up (the assistant's answer, or the part of it a dropped stream saw, and
a new user message), a branch (an earlier user turn edited, the turns after it dropped), a
regenerate (the same messages again), or a completion whose prompt is token ids (a new one
or the previous prompt extended). A "big" client sends only token-id prompts of 75-97 %
of the context, with ignore_eos and up to `longest` new tokens (some run into the context): two
of them fill a small pool, so refusals, truncations and evictions keep happening.

Every request is streamed or not at random; a stream is dropped after a few events with
probability `disconnect_p`. A refusal is retried after its Retry-After (never sooner),
at most `max_retries` times; a hint longer than `max_retry_wait_s` gives the turn up after
waiting that long (a client never sends again at once after a 503).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field

from benchmarks.serve_parts.client import WORDS
from benchmarks.soak_parts.exchange import Exchange, send

TOKENS_PER_WORD = 2.0  # upper bound for WORDS with a space (measured ~1.3); keeps prompts < context
TEMPLATE_TOKENS = 8  # per chat message (role markers), generous
ID_RANGE = (200, 40000)  # token ids for raw prompts: ordinary vocabulary, no special tokens


@dataclass
class Load:
    """What the clients share: where to send, how long, and the knobs of the mix."""

    url: str
    max_context: int
    deadline: float  # time.perf_counter() after which no client starts a request
    t0: float
    seed: int
    disconnect_p: float = 0.15
    stream_p: float = 0.7
    request_timeout_s: float = 300.0
    max_retries: int = 3
    max_retry_wait_s: float = 20.0
    longest: int = 96  # the most new tokens a request asks for
    records: list[Exchange] = field(default_factory=list)
    in_flight: int = 0


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n))).capitalize() + "."


def prompt_tokens(rng: random.Random, max_context: int) -> int:
    """Log-uniform from 16 tokens to 85 % of the context: mostly short, some near the top."""
    return int(math.exp(rng.uniform(math.log(16), math.log(0.85 * max_context))))


def max_tokens_for(rng: random.Random, room: int, longest: int) -> int:
    """Mostly short answers, some longer; past the room left when the prompt nears the
    context (then the answer ends with "length" at the context). At most `longest`: on 2
    shared cores a lane may decode only a few tokens a second."""
    r = rng.random()
    if r < 0.6:
        n = rng.randint(1, 16)
    elif r < 0.9:
        n = rng.randint(16, 64)
    else:
        n = rng.randint(64, max(64, longest))
    if room < longest and rng.random() < 0.3:
        n = rng.randint(max(1, room - 8), longest)
    return max(1, min(n, longest))


class Conversation:
    """A chat: its messages, and the tokens its last answer said it held (0: unknown)."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.tokens = 0

    def estimate(self, extra_words: int = 0) -> int:
        """Prompt tokens of the messages (plus a user turn of `extra_words`), from above."""
        guess = sum(_message_tokens(m) for m in self.messages)
        return max(self.tokens + TEMPLATE_TOKENS, guess) + int(TOKENS_PER_WORD * extra_words) + TEMPLATE_TOKENS


def _message_tokens(m: dict) -> int:
    text = m["content"]
    if m["role"] == "assistant":  # the model's text: any characters; ~4 per token, 2 from above
        return len(text) // 2 + len(text.split()) + TEMPLATE_TOKENS
    return int(TOKENS_PER_WORD * len(text.split())) + TEMPLATE_TOKENS


async def run_client(i: int, big: bool, load: Load, http) -> None:
    rng = random.Random(load.seed * 1000 + i)
    conv: Conversation | None = None
    raw: list[int] | None = None  # the previous token-id prompt
    ctx = load.max_context
    while time.perf_counter() < load.deadline:
        if big:
            if raw is not None and len(raw) < 0.9 * ctx and rng.random() < 0.3:
                action, raw = "big_follow_up", raw + _ids(rng, rng.randint(8, int(0.97 * ctx) - len(raw)))
            else:
                action, raw = "big", _ids(rng, rng.randint(int(0.75 * ctx), int(0.97 * ctx)))
            body = {"prompt": raw, "max_tokens": rng.randint(16, load.longest), "ignore_eos": True}
            endpoint = "completions"
        else:
            r = rng.random()
            user_words = rng.randint(3, 60)
            if r < 0.15:
                endpoint = "completions"
                if raw is not None and rng.random() < 0.4 and len(raw) + 64 < ctx:
                    action, raw = "follow_up", raw + _ids(rng, rng.randint(1, min(64, ctx - len(raw) - 1)))
                else:
                    action, raw = "new", _ids(rng, prompt_tokens(rng, ctx))
                room = ctx - len(raw)
                body = {"prompt": raw, "max_tokens": max_tokens_for(rng, room, load.longest), "ignore_eos": rng.random() < 0.5}
            else:
                endpoint = "chat"
                users = [k for k, m in enumerate(conv.messages) if m["role"] == "user"] if conv else []
                if conv is not None and r < 0.55 and conv.estimate(user_words) < 0.85 * ctx:
                    action = "follow_up"
                    conv.messages.append({"role": "user", "content": words(rng, user_words)})
                elif conv is not None and r < 0.75 and len(users) > 1:
                    action = "branch"
                    cut = rng.choice(users[:-1])
                    conv.messages = conv.messages[:cut] + [{"role": "user", "content": words(rng, user_words)}]
                    conv.tokens = 0  # unknown until the answer says
                elif conv is not None and r < 0.8 and conv.messages[-1]["role"] == "assistant":
                    action = "regenerate"
                    conv.messages.pop()
                else:
                    action, conv = "new", Conversation()
                    n = max(3, int(prompt_tokens(rng, ctx) / TOKENS_PER_WORD))
                    if rng.random() < 0.5:
                        conv.messages.append({"role": "system", "content": words(rng, rng.randint(3, 30))})
                        n = max(3, n - 30)
                    conv.messages.append({"role": "user", "content": words(rng, n)})
                room = ctx - conv.estimate()
                body = {"messages": [dict(m) for m in conv.messages],
                        "max_tokens": max_tokens_for(rng, room, load.longest), "ignore_eos": rng.random() < 0.3}
        body["temperature"] = rng.choice([0.0, 0.7, 1.0])
        body["seed"] = rng.randint(0, 2**31 - 1)
        stream = rng.random() < load.stream_p
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        drop_after = None
        if stream and rng.random() < load.disconnect_p:
            drop_after = rng.randint(1, 12)  # content events
        elif not stream and rng.random() < load.disconnect_p / 2:
            drop_after = rng.uniform(0.2, 4.0)  # seconds without the answer
        rec = await _with_retries(i, endpoint, action, stream, body, drop_after, load, http)
        if endpoint == "chat" and conv is not None:
            _after_chat(conv, rec, rng)


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*ID_RANGE) for _ in range(max(1, n))]


def _after_chat(conv: Conversation, rec: Exchange, rng: random.Random) -> None:
    """Keep the answer (whole or the part seen) as the assistant's turn; a refused turn is dropped."""
    if rec.outcome in ("complete", "truncated", "disconnected") and rec.text:
        conv.messages.append({"role": "assistant", "content": rec.text})
        if rec.prompt_tokens >= 0:
            conv.tokens = rec.prompt_tokens + max(rec.completion_tokens, 0)
        else:  # a dropped stream: no usage; a generous guess
            conv.tokens = max(conv.tokens, 0) + 4 * rec.completion_tokens + 50
    elif conv.messages and conv.messages[-1]["role"] == "user":
        conv.messages.pop()  # the turn never happened
        if not conv.messages:
            conv.messages.append({"role": "user", "content": words(rng, 5)})


async def _with_retries(i: int, endpoint: str, action: str, stream: bool, body: dict,
                        drop_after: float | None, load: Load, http) -> Exchange:
    url = load.url + ("/v1/chat/completions" if endpoint == "chat" else "/v1/completions")
    attempt = 0
    while True:
        rec = Exchange(i, endpoint, action, stream, body["max_tokens"], 0.0, attempt)
        load.records.append(rec)
        load.in_flight += 1
        try:
            await send(http, url, body, rec, load.t0, drop_after, load.request_timeout_s)
        finally:
            load.in_flight -= 1
        if rec.outcome != "refused" or attempt >= load.max_retries:
            return rec
        # Back off for the hint (at most max_retry_wait_s, and not past the deadline) whatever
        # comes next; retry only when the whole hint has passed: never sooner than asked.
        wait = rec.retry_after or 1.0
        await asyncio.sleep(max(0.0, min(wait, load.max_retry_wait_s, load.deadline - time.perf_counter())))
        if wait > load.max_retry_wait_s or time.perf_counter() >= load.deadline:
            return rec
        attempt += 1


async def run_clients(load: Load, num_clients: int, num_big: int) -> None:
    import httpx

    limits = httpx.Limits(max_connections=num_clients + 4, max_keepalive_connections=num_clients + 4)
    # A stream is never silent longer than the server's SSE keep-alive; a plain request is
    # silent until its answer: `send` bounds both by request_timeout_s.
    timeout = httpx.Timeout(connect=10.0, read=load.request_timeout_s, write=30.0, pool=30.0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        await asyncio.gather(*(run_client(i, i < num_big, load, http) for i in range(num_clients)))
