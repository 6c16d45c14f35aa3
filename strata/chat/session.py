"""`/save` and `/load`: a chat as a session file, its K/V and tokens plus its turns.

The turns go in the header's application metadata under "chat" (kv/session_format.py), so
one file holds both and `strata session inspect` shows them. Save writes the held
conversation that the chat's rendered history extends (the cells the next turn would
reuse); load reads the header first, so a file without a chat, or a bad one, changes
nothing, then restores the K/V (parked: the next turn's prompt extends it, and only its
new tokens are prefilled) and hands back the turns.
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.chat.history import ChatHistory
from strata.engine.interface import Engine
from strata.errors import SessionFileError
from strata.cells.session import SessionReader

CHAT_KEY = "chat"


@dataclass(frozen=True)
class ChatSaved:
    path: str
    num_cells: int  # tokens whose K/V the file holds
    num_turns: int
    num_bytes: int


@dataclass(frozen=True)
class ChatLoaded:
    path: str
    history: ChatHistory
    num_cells: int  # tokens parked in the cache, reused by the next turn


def save_chat(engine: Engine, history: ChatHistory, path: str) -> ChatSaved:
    """Writes the chat's held conversation and its turns to `path`; ValueError if it has no turns."""
    if not history.turns:
        raise ValueError("there is nothing to save yet (the chat has no turns)")
    token_ids = engine.tokenizer.encode_chat(history.messages(), add_generation_prompt=False)
    saved = engine.save_session(path, token_ids=token_ids, metadata={CHAT_KEY: history.to_json()})
    return ChatSaved(path, saved.num_cells, len(history.turns), saved.num_bytes)


def read_chat(path: str) -> ChatHistory:
    """The turns a session file holds (its header only); SessionFileError if it has none."""
    with SessionReader.open(path) as reader:
        metadata = reader.header.metadata
    if CHAT_KEY not in metadata:
        raise SessionFileError(path, "holds no chat (it was not saved by strata chat's /save)")
    try:
        return ChatHistory.from_json(metadata[CHAT_KEY])
    except ValueError as exc:
        raise SessionFileError(path, f"its chat is malformed ({exc})") from exc


def load_chat(engine: Engine, path: str) -> ChatLoaded:
    """Parks the file's conversation in the cache and returns its chat; all or nothing."""
    history = read_chat(path)
    restored = engine.restore_session(path)
    return ChatLoaded(path, history, restored.num_cells)
