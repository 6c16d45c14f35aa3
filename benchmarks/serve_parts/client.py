"""The load: prompts of random words as token ids, and the streaming clients that send them,
one concurrency level at a time, recording when each token arrived."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from benchmarks.common import host_busy_cpu_s

if TYPE_CHECKING:
    from benchmarks.serve_parts.servers import Server

_WORDS = (
    "river stone lantern harbor window garden quiet morning letter bridge silver thunder orchard "
    "candle market winter meadow valley forest copper engine signal island mirror pocket ladder "
    "tunnel summer feather canyon basket marble violin castle planet rocket shadow blanket "
    "compass anchor desert glacier village kettle pencil ribbon saddle temple walnut whistle "
    "yellow zebra crystal falcon harvest journey kingdom meadowlark notebook oyster pepper quilt "
    "rainbow sparrow tiger umbrella velvet wagon yarn acorn beacon cabin dolphin ember fossil "
    "granite hollow ivory jasmine kayak lemon maple nectar olive pebble quartz raven spruce "
    "tulip unicorn vessel willow timber carpet bottle circle doctor farmer hunter sailor "
    "teacher painter walks sings carries builds watches opens closes finds brings keeps leaves "
    "under over beside behind across through after before during toward slowly quickly "
    "gently quietly bright dark warm cold ancient modern hidden golden broken gentle"
)
WORDS = _WORDS.split()


def make_prompts(tokenizer, count: int, length: int, seed: int) -> list[list[int]]:
    """`count` prompts of exactly `length` token ids, random words, each its own from the start."""
    rng = random.Random(seed)
    prompts = []
    while len(prompts) < count:
        text = " ".join(rng.choice(WORDS) for _ in range(length * 2)).capitalize() + "."
        ids = tokenizer.encode(text)[:length]
        if len(ids) == length and all(ids[0] != p[0] for p in prompts[-16:]):
            prompts.append(ids)
    return prompts


@dataclass
class Record:
    """One request as its client saw it (seconds on the benchmark's perf_counter clock)."""

    client: int
    sent: float
    token_times: list[float] = field(default_factory=list)  # a streamed event with text
    prompt_tokens: int = -1
    completion_tokens: int = -1
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.sent

    @property
    def tpot(self) -> float:
        n = max(self.completion_tokens, len(self.token_times))
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else float("nan")

    @property
    def gaps(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]


async def one_request(client, url: str, prompt: list[int], new: int, rec: Record) -> None:
    body = {
        "prompt": prompt, "max_tokens": new, "temperature": 0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    }
    rec.sent = time.perf_counter()
    # A fresh connection each time: a kept-alive one the server has just closed would fail the
    # request (llama-server closes idle ones); a loopback connect costs well under a millisecond.
    headers = {"Connection": "close"}
    async with client.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            rec.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
            return
        async for line in r.aiter_lines():
            now = time.perf_counter()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                rec.error = str(event["error"])[:300]
                return
            if event.get("choices") and event["choices"][0].get("text"):
                rec.token_times.append(now)
            if event.get("usage"):
                rec.prompt_tokens = event["usage"]["prompt_tokens"]
                rec.completion_tokens = event["usage"]["completion_tokens"]


async def run_level(url: str, prompts: list[list[int]], concurrency: int, new: int) -> dict:
    """`concurrency` clients take the prompts in order, each sending its next as soon as one ends."""
    import httpx

    queue: asyncio.Queue = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    records: list[Record] = []
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)

    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:

        async def worker(i: int) -> None:
            while not queue.empty():
                prompt = queue.get_nowait()
                rec = Record(client=i, sent=time.perf_counter())
                records.append(rec)
                try:
                    await one_request(client, url, prompt, new, rec)
                except httpx.HTTPError as exc:
                    rec.error = f"{type(exc).__name__}: {exc}"

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"t0": t0, "wall_s": wall, "records": records}


def measured(servers: dict[str, Server], arm: str, level) -> dict:
    """Runs the `level` coroutine, adding what the CPUs did meanwhile: the idle peer server's CPU seconds,
    and the share of all CPUs used by anything but the servers and this process."""
    import psutil

    me = psutil.Process()
    peers = [s for a, s in servers.items() if a != arm]
    host0, own0 = host_busy_cpu_s(), sum(s.cpu_s() for s in servers.values()) + sum(me.cpu_times()[:2])
    peer0 = sum(s.cpu_s() for s in peers)
    run = asyncio.run(level)
    host1, own1 = host_busy_cpu_s(), sum(s.cpu_s() for s in servers.values()) + sum(me.cpu_times()[:2])
    run["peer_cpu_s"] = sum(s.cpu_s() for s in peers) - peer0
    others = max(0.0, (host1 - host0) - (own1 - own0))
    run["others_cpu_share"] = others / (run["wall_s"] * (psutil.cpu_count() or 1))
    return run
