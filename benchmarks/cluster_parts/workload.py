"""The load: multi-turn chat conversations, with one system prompt shared by all of them
("shared") or a system prompt of the same length of its own per conversation ("distinct").

Text is random words (serve_parts' list), seeded, so every arm sends the same first turns;
later turns carry the assistant's replies as the replica streamed them (greedy, fixed
length), so the history each arm sends is what its own replicas answered. Turn order:
every conversation's turn t before any turn t + 1, the conversations shuffled per turn
(seeded), so no arm is helped by a fixed order (round robin over 2 replicas with a fixed
even order would keep every conversation on one replica by accident).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from benchmarks.serve_parts.client import WORDS

WORKLOADS = ("shared", "distinct")


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


@dataclass
class Conversation:
    cid: int
    system: str
    questions: list[str]  # one user message per turn
    messages: list[dict] = field(default_factory=list)  # the history sent so far, replies included

    def next_messages(self, turn: int) -> list[dict]:
        if not self.messages:
            self.messages = [{"role": "system", "content": self.system}]
        self.messages.append({"role": "user", "content": self.questions[turn]})
        return list(self.messages)

    def answered(self, reply: str) -> None:
        self.messages.append({"role": "assistant", "content": reply})


def conversations(workload: str, count: int, turns: int, system_words: int, user_words: int,
                  seed: int) -> list[Conversation]:
    """`count` conversations of `turns` user messages; a fresh list per run (histories fill in)."""
    rng = random.Random(seed)
    shared = "You are a helpful assistant. " + _text(rng, system_words)
    out = []
    for c in range(count):
        system = shared if workload == "shared" else f"You are assistant number {c}. " + _text(rng, system_words)
        out.append(Conversation(c, system, [f"Question {t + 1}: " + _text(rng, user_words) for t in range(turns)]))
    return out


def schedule(count: int, turns: int, seed: int) -> list[tuple[int, int]]:
    """(conversation, turn) in sending order: turn by turn, conversations shuffled per turn."""
    rng = random.Random(seed + 1)
    order = []
    for t in range(turns):
        cs = list(range(count))
        rng.shuffle(cs)
        order += [(c, t) for c in cs]
    return order
