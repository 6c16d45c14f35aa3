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

    def to_json(self) -> dict:
        """The chat as a JSON object (kept in a session file's metadata under "chat")."""
        return {"system": self.system,
                "turns": [{"user": t.user, "assistant": t.assistant, "stopped": t.stopped}
                          for t in self.turns]}

    @classmethod
    def from_json(cls, d: object) -> ChatHistory:
        """The inverse of `to_json`; ValueError naming what is malformed."""
        if not isinstance(d, dict) or not isinstance(d.get("turns"), list):
            raise ValueError("the chat is not an object with a list of turns")
        system = d.get("system")
        if system is not None and not isinstance(system, str):
            raise ValueError("the chat's system prompt is not a string")
        turns = []
        for i, t in enumerate(d["turns"], 1):
            if not (isinstance(t, dict) and isinstance(t.get("user"), str)
                    and isinstance(t.get("assistant"), str) and isinstance(t.get("stopped", False), bool)):
                raise ValueError(f"turn {i} is not {{user, assistant, stopped}} text")
            turns.append(Turn(t["user"], t["assistant"], t.get("stopped", False)))
        return cls(system or None, turns)
