"""The same chat sent twice at temperature 0 starts its answer the same, the second time from
the prefix cache, on the default serving path (bfloat16, `--weights auto`: pool_server). The
retry computes only its prompt's last token, on the prompt path as the first request did
(models/rows.py), so its first token is the first request's. Later tokens are not compared: the
dense bfloat16 GEMM at one row and at the prompt's row count round differently on some CPUs
(an AVX-512 EPYC), and near-ties then part (tests/model/test_row_kinds.py)."""

from __future__ import annotations

# Chats that answered differently on their retry when a cached prompt's last token was
# computed as a decode row (4-bit projections, int8 head); tests/model/test_row_kinds.py.
CHATS = ["What color is a ruby? Answer in one sentence.", "Name a color.", "Write a haiku about tides."]


def test_a_repeated_chat_starts_the_same_from_the_prefix_cache(pool_server):
    with pool_server.client() as c:
        for chat in CHATS:
            body = {"messages": [{"role": "user", "content": chat}], "max_tokens": 1, "temperature": 0}
            first, retry = (c.post("/v1/chat/completions", json=body).json() for _ in range(2))
            usage = retry["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1, usage
            assert usage["completion_tokens"] == 1, usage
            assert retry["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"], chat
