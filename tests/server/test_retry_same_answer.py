"""The same chat sent twice at temperature 0 answers the same, the second time from the prefix
cache, on the default serving path (bfloat16, `--weights auto`: pool_server, whose chunks of 16
cells make the retry's table end in a copy of the cached partial chunk). The retry computes only
its prompt's last token, on the prompt path as the first request did, as one query over all its
cells (models/rows.py), so that row is bit-identical to the cold prompt's last row, and the
decode steps after it read the same cells: the whole answer is the first request's
(tests/model/test_row_kinds.py)."""

from __future__ import annotations

# Chats that answered differently on their retry when a cached prompt's last token was
# computed as a decode row (4-bit projections, int8 head), or attended within its cold piece.
CHATS = ["What color is a ruby? Answer in one sentence.", "Name a color.", "Write a haiku about tides."]


def test_a_repeated_chat_answers_the_same_from_the_prefix_cache(pool_server):
    with pool_server.client() as c:
        for chat in CHATS:
            body = {"messages": [{"role": "user", "content": chat}], "max_tokens": 16, "temperature": 0}
            first, retry = (c.post("/v1/chat/completions", json=body).json() for _ in range(2))
            usage = retry["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1, usage
            assert usage["completion_tokens"] == first["usage"]["completion_tokens"], (usage, first["usage"])
            assert retry["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"], chat
