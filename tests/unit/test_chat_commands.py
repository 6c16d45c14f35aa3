"""`strata chat`'s command parsing and turn history (no model)."""

from __future__ import annotations

import io
import json

import pytest

from strata.chat.commands import Command, CommandError, parse
from strata.chat.history import ChatHistory, Turn
from strata.errors import SessionFileError
from strata.kv.session_format import KVGeometry, SessionHeader, read_header


def test_lines_parse_into_commands_or_messages():
    assert parse("hello /there") == Command("message", "hello /there")
    assert parse("//etc/hosts is a file") == Command("message", "/etc/hosts is a file")
    assert parse("/branch 2") == Command("branch", "2", 2)
    assert parse("/system Be brief.") == Command("system", "Be brief.")
    assert parse("/system") == Command("system", "")
    assert parse("/regen") == Command("regenerate") and parse("/exit") == Command("quit")
    assert parse("/save chats/a b.strata ") == Command("save", "chats/a b.strata")
    assert parse("/load chat.strata") == Command("load", "chat.strata")
    for bad, said in [("/branch", "turn number"), ("/branch two", "turn number"),
                      ("/save", "file name"), ("/load  ", "file name"), ("/savex f", "unknown"), ("/stats now", "no argument"), ("/nope", "unknown")]:
        with pytest.raises(CommandError, match=said):
            parse(bad)


def test_history_renders_branches_and_pops():
    chat = ChatHistory(system="S", turns=[Turn("q1", "a1"), Turn("q2", "a2"), Turn("q3", "a3")])
    assert chat.messages("q4") == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "q3"}, {"role": "assistant", "content": "a3"},
        {"role": "user", "content": "q4"},
    ]
    assert [t.user for t in chat.branch(1)] == ["q2", "q3"] and len(chat.turns) == 1
    with pytest.raises(ValueError, match="turn 2 does not exist"):
        chat.branch(2)
    assert chat.pop_last().user == "q1" and chat.turns == []
    with pytest.raises(ValueError, match="nothing|no answer"):
        chat.pop_last()
    assert ChatHistory().messages("hi") == [{"role": "user", "content": "hi"}]


def test_history_round_trips_through_json_and_refuses_malformed():
    chat = ChatHistory(system="S", turns=[Turn("q1", "a1"), Turn("q2", "a", stopped=True)])
    assert ChatHistory.from_json(json.loads(json.dumps(chat.to_json()))) == chat
    assert ChatHistory.from_json(ChatHistory().to_json()) == ChatHistory()
    for bad, said in [([], "list of turns"), ({"turns": 3}, "list of turns"),
                      ({"system": 5, "turns": []}, "system prompt"),
                      ({"turns": [{"user": "q"}]}, "turn 1"),
                      ({"turns": [{"user": "q", "assistant": "a", "stopped": "no"}]}, "turn 1")]:
        with pytest.raises(ValueError, match=said):
            ChatHistory.from_json(bad)


def test_session_header_metadata_is_optional_and_round_trips():
    geometry = KVGeometry(2, 2, 8, "f32")
    plain = SessionHeader("fp", geometry, 16, [1, 2, 3], [0])
    assert b"metadata" not in plain.encode()  # files without metadata are byte-for-byte as before
    assert read_header(io.BytesIO(plain.encode()), "p")[0] == plain
    chat = {"chat": ChatHistory(turns=[Turn("q", "a")]).to_json()}
    with_meta = SessionHeader("fp", geometry, 16, [1, 2, 3], [0], chat)
    assert read_header(io.BytesIO(with_meta.encode()), "m")[0].metadata == chat
    not_an_object = SessionHeader("fp", geometry, 16, [1, 2, 3], [0], ["chat"])  # type: ignore[arg-type]
    with pytest.raises(SessionFileError, match="metadata must be a JSON object"):
        read_header(io.BytesIO(not_an_object.encode()), "bad")
