"""The chat's slash commands, parsed into typed values; anything else is a message."""

from __future__ import annotations

from dataclasses import dataclass

HELP = """\
/regenerate      answer the last message again (its prompt is all cached)
/branch N        continue from turn N (turns after it are dropped; N's K/V is reused)
/history         the turns so far, numbered
/system TEXT     set the system prompt (/system alone clears it)
/stats           this chat's tokens (computed, cached), speed, and the KV pool
/save FILE       save the chat to a session file
/load FILE       load a chat from a session file
/help            this list
/quit            leave (Ctrl-D too); Ctrl-C stops an answer, keeping the chat"""


@dataclass(frozen=True)
class Command:
    name: str  # "message" for a line that is not a command
    arg: str = ""
    number: int | None = None  # /branch N


class CommandError(ValueError):
    """A line that names a command but misuses it; the message says how to use it."""


NAMES = ("regenerate", "branch", "history", "system", "stats", "save", "load", "help", "quit")
ALIASES = {"exit": "quit", "q": "quit", "regen": "regenerate", "r": "regenerate"}


def parse(line: str) -> Command:
    if not line.startswith("/") or line.startswith("//"):
        return Command("message", line[1:] if line.startswith("//") else line)
    word, _, rest = line[1:].partition(" ")
    name = ALIASES.get(word, word)
    rest = rest.strip()
    if name not in NAMES:
        raise CommandError(f"unknown command /{word} (/help lists them; start with // to send '/')")
    if name == "branch":
        if not rest.isdigit():
            raise CommandError("/branch needs a turn number: /branch N (see /history)")
        return Command(name, rest, int(rest))
    if name in ("save", "load") and not rest:
        raise CommandError(f"/{name} needs a file name: /{name} FILE")
    if name in ("regenerate", "history", "stats", "help", "quit") and rest:
        raise CommandError(f"/{name} takes no argument")
    return Command(name, rest)
