"""One request and how it ended.

Every request ends as exactly one of OUTCOMES:
- complete: a 200 whose answer ended with finish_reason stop or length (not truncated);
- truncated: finish_reason "length" with `truncated: true` (the pool could not grow it);
- refused: a 503 `kv_pool_full` or `queue_full` with a Retry-After header, or (a stream
  that had started) an SSE error event `kv_pool_full` carrying `retry_after`, then [DONE];
- disconnected: a stream we closed on purpose after k events;
- failure: anything else: another status, a 503 without Retry-After, a stream without
  [DONE] or without a finish_reason, an answer that breaks the API's shape, a connection
  error, or a hang (no byte for `read_timeout_s`, or no end within `request_timeout_s`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

OUTCOMES = ("complete", "truncated", "refused", "disconnected", "failure")
RETRYABLE_CODES = ("kv_pool_full", "queue_full")
# A stream is never silent longer than the server's SSE keep-alive (seconds): this much is a hang.
STREAM_SILENCE_S = 60.0


@dataclass
class Exchange:
    client: int
    endpoint: str  # "chat" | "completions"
    action: str  # "new" | "follow_up" | "branch" | "regenerate" | "big" | "big_follow_up"
    stream: bool
    max_tokens: int
    sent: float  # seconds since the soak started
    attempt: int = 0  # 0: first try; n: the n-th retry after a refusal
    ended: float = -1.0
    outcome: str = "failure"
    detail: str = ""  # finish_reason, the refusal's code (+ "/sse"), or what went wrong
    retry_after: float | None = None
    prompt_tokens: int = -1
    cached_tokens: int = -1
    completion_tokens: int = -1  # from usage; a dropped stream: the content events it saw
    ttft: float | None = None  # to the first content event (streams) or the whole answer
    text: str = ""  # the answer (or the part a dropped stream saw); not written to JSON

    def end(self, outcome: str, detail: str = "") -> Exchange:
        self.outcome, self.detail = outcome, detail
        return self


async def send(client, url: str, body: dict, rec: Exchange, t0: float, drop_after: float | None,
               request_timeout_s: float) -> Exchange:
    """Sends `body` to `url`, filling `rec`. `drop_after`: a stream is dropped after that many
    content events; a plain request after that many seconds without its answer."""
    import httpx

    start = time.perf_counter()
    rec.sent = start - t0
    work = _send(client, url, body, rec, start, None if not rec.stream else drop_after)
    try:
        if not rec.stream and drop_after is not None:
            try:
                await asyncio.wait_for(work, drop_after)
            except asyncio.TimeoutError:  # cancelling the request closes its connection
                rec.end("disconnected", f"after {drop_after:.1f} s")
        else:
            await asyncio.wait_for(work, request_timeout_s)
    except asyncio.TimeoutError:
        rec.end("failure", f"hang: no end within {request_timeout_s:.0f} s")
    except httpx.ReadTimeout:
        rec.end("failure", "hang: no byte within the read timeout"
                + (f" ({STREAM_SILENCE_S:.0f} s, a stream)" if rec.stream else ""))
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        rec.end("failure", f"{type(exc).__name__}: {exc}"[:300])
    rec.ended = time.perf_counter() - t0
    return rec


def _refusal(rec: Exchange, status: int, headers, raw: bytes) -> Exchange:
    try:
        error = json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        return rec.end("failure", f"HTTP {status}, not an error body: {raw[:200]!r}")
    code = error.get("code")
    if status == 503 and code in RETRYABLE_CODES:
        header = headers.get("retry-after")
        if header is None or not header.isdigit() or int(header) < 1:
            return rec.end("failure", f"503 {code} without a valid Retry-After ({header!r})")
        rec.retry_after = float(header)
        return rec.end("refused", code)
    return rec.end("failure", f"HTTP {status} {code}: {error.get('message', '')[:200]}")


def _usage(rec: Exchange, usage: dict | None) -> None:
    if usage:
        rec.prompt_tokens = usage["prompt_tokens"]
        rec.completion_tokens = usage["completion_tokens"]
        rec.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]


def _finish(rec: Exchange, choice: dict) -> Exchange:
    reason, truncated = choice.get("finish_reason"), bool(choice.get("truncated"))
    if reason not in ("stop", "length"):
        return rec.end("failure", f"finish_reason {reason!r}")
    if truncated and reason != "length":
        return rec.end("failure", f"truncated with finish_reason {reason!r}")
    return rec.end("truncated" if truncated else "complete", reason)


def _content(endpoint: str, choice: dict) -> str:
    if endpoint == "chat":
        return choice.get("delta", {}).get("content") or ""
    return choice.get("text") or ""


async def _send(client, url: str, body: dict, rec: Exchange, start: float,
                drop_after: int | None) -> None:
    if not rec.stream:
        r = await client.post(url, json=body)
        if r.status_code != 200:
            _refusal(rec, r.status_code, r.headers, r.content)
            return
        answer = r.json()
        rec.ttft = time.perf_counter() - start
        choice = answer["choices"][0]
        rec.text = choice["message"]["content"] if rec.endpoint == "chat" else choice["text"]
        _usage(rec, answer.get("usage"))
        _finish(rec, choice)
        return
    import httpx

    silence = httpx.Timeout(STREAM_SILENCE_S, connect=10.0)
    async with client.stream("POST", url, json=body, timeout=silence) as r:
        if r.status_code != 200:
            _refusal(rec, r.status_code, r.headers, await r.aread())
            return
        seen, pieces, ended = 0, [], None
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue  # blank separators and keep-alive comments
            payload = line[len("data: "):]
            if payload == "[DONE]":
                rec.text = "".join(pieces)
                if ended is None:
                    rec.end("failure", "[DONE] before a finish_reason")
                return
            if ended is not None and ended.outcome != "complete" and ended.outcome != "truncated":
                rec.end("failure", f"an event after the end: {payload[:120]}")
                return
            event = json.loads(payload)
            if "error" in event:
                error = event["error"]
                if error.get("code") == "kv_pool_full" and int(error.get("retry_after") or 0) >= 1:
                    rec.retry_after = float(error["retry_after"])
                    ended = rec.end("refused", "kv_pool_full/sse")
                else:
                    ended = rec.end("failure", f"SSE error {error.get('code')}: {error.get('message')}")
                continue
            _usage(rec, event.get("usage"))
            for choice in event.get("choices") or []:
                text = _content(rec.endpoint, choice)
                if text:
                    if rec.ttft is None:
                        rec.ttft = time.perf_counter() - start
                    pieces.append(text)
                    seen += 1
                if choice.get("finish_reason") is not None:
                    if ended is not None:
                        rec.end("failure", "two finish events")
                        return
                    ended = _finish(rec, choice)
            if drop_after is not None and ended is None and seen >= drop_after:
                rec.text, rec.completion_tokens = "".join(pieces), seen
                rec.end("disconnected", f"after {seen} events")
                return  # leaving the block closes the connection mid-stream
        rec.text = "".join(pieces)
        rec.end("failure", "the stream ended without [DONE]")
