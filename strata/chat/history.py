"""A chat's turns as text: what `strata chat` re-renders into prompt ids each turn.

The engine's conversation cache does the reuse: each prompt is the whole chat so far, and
the longest cached token prefix (the same chat a turn earlier, or a branch of it) is not
computed again.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Turn:
    user: str
    assistant: str = ""
    stopped: bool = False  # the answer was cut short (Ctrl-C); its text so far is kept


@dataclass
class ChatHistory:
    system: str | None = None
    turns: list[Turn] = field(default_factory=list)

    def messages(self, pending_user: str | None = None) -> list[dict[str, str]]:
        """Chat-template messages: the system prompt, every turn, then `pending_user`."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        for turn in self.turns:
            out.append({"role": "user", "content": turn.user})
            out.append({"role": "assistant", "content": turn.assistant})
        if pending_user is not None:
            out.append({"role": "user", "content": pending_user})
        return out

    def branch(self, num_turns: int) -> list[Turn]:
        """Keep turns 1..num_turns (the chat continues from turn `num_turns`); returns the
        turns dropped. 0 keeps none."""
        if not 0 <= num_turns <= len(self.turns):
            raise ValueError(f"turn {num_turns} does not exist (the chat has {len(self.turns)})")
        dropped = self.turns[num_turns:]
        del self.turns[num_turns:]
        return dropped

    def pop_last(self) -> Turn:
        """The last turn, taken off (for /regenerate: its question is asked again)."""
        if not self.turns:
            raise ValueError("there is no answer to regenerate yet")
        return self.turns.pop()
