"""The clients: `clients` workers take (conversation, turn) pairs in the schedule's order,
each turn waiting for its conversation's previous one, and stream each turn from the
front door (POST /v1/chat/completions, greedy, `ignore_eos`, usage in the last chunk).
A record per turn: times on this process's perf_counter clock, usage, and the front
door's headers (x-strata-replica / -route / -migrated-tokens)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from benchmarks.cluster_parts.workload import Conversation


@dataclass
class Turn:
    conv: int
    turn: int
    sent: float = 0.0
    first: float | None = None  # first chunk with content
    end: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    replica: str = ""
    route: str = ""
    migrated: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent


async def one_turn(client, url: str, messages: list[dict], new: int, rec: Turn) -> str:
    body = {"messages": messages, "max_tokens": new, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    parts: list[str] = []
    rec.sent = time.perf_counter()
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        rec.replica = r.headers.get("x-strata-replica", "")
        rec.route = r.headers.get("x-strata-route", "")
        rec.migrated = int(r.headers.get("x-strata-migrated-tokens", 0))
        if r.status_code != 200:
            rec.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
            return ""
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                rec.error = str(event["error"])[:300]
                return ""
            if event.get("choices") and event["choices"][0].get("delta", {}).get("content"):
                rec.first = rec.first or time.perf_counter()
                parts.append(event["choices"][0]["delta"]["content"])
            if event.get("usage"):
                u = event["usage"]
                rec.prompt_tokens, rec.completion_tokens = u["prompt_tokens"], u["completion_tokens"]
                rec.cached_tokens = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    rec.end = time.perf_counter()
    return "".join(parts)


async def run_conversations(url: str, convs: list[Conversation], order: list[tuple[int, int]], clients: int,
                            new: int) -> dict:
    import httpx

    queue: asyncio.Queue = asyncio.Queue()
    for item in order:
        queue.put_nowait(item)
    done = {(c.cid, t): asyncio.Event() for c in convs for t in range(len(c.questions))}
    records: list[Turn] = []

    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:

        async def worker() -> None:
            while not queue.empty():
                cid, t = queue.get_nowait()
                if t > 0:
                    await done[(cid, t - 1)].wait()
                conv, rec = convs[cid], Turn(cid, t)
                records.append(rec)
                try:
                    conv.answered(await one_turn(client, url, conv.next_messages(t), new, rec))
                except httpx.HTTPError as exc:
                    rec.error = f"{type(exc).__name__}: {exc}"
                finally:
                    done[(cid, t)].set()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
        metrics = (await client.get(url + "/metrics")).text
    return {"t0": t0, "wall_s": wall, "records": records, "front_metrics": metrics}


async def warm(url: str, replica_ids: list[str]) -> None:
    """One short unrelated request pinned to each replica (first-request costs out of the way)."""
    import httpx

    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), headers={}) as client:
        for i, rid in enumerate(replica_ids):
            rec = Turn(-1, i)
            client.headers["x-strata-replica"] = rid
            await one_turn(client, url, [{"role": "user", "content": f"Warm up {i}: say hello."}], 4, rec)
            if rec.error or rec.replica != rid:
                raise RuntimeError(f"warm-up request pinned to {rid} failed: {rec.error} "
                                   f"(served by {rec.replica})")
