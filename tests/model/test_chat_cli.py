"""`strata chat` through a pseudo-terminal (pexpect): the default model in float32, so the
streamed text is exact; the footers' token counts show what the conversation cache reused."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys

import pytest

from strata import LLM, SamplingParams
from strata.config import DEFAULT_SPEC_K
from strata.kv.session_format import read_header
from tests import stepped
from tests.stepped import Gate
from tests.conftest import require

pexpect = require("pexpect")

ENGINE = {"dtype": "float32", "max_context": 512, "batch": 0}
MAX_NEW = 32
FOOTER = re.compile(
    r"\[prompt (\d+) tokens: (\d+) cached, (\d+) new \| answer (\d+) tokens[^\]\r\n]*\]"
)
STOPPED = re.compile(r"\[stopped \| prompt (\d+) tokens: (\d+) cached, (\d+) new \| answer (\d+)")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Chat:
    """`strata chat` on a pseudo-terminal. With `gate` (tests/stepped.py), the test decides how
    many steps an answer gets."""

    def __init__(self, gguf_path: str, gate: Gate | None = None, **env_extra: str):
        args = ["chat", "--model", gguf_path, "--temperature", "0",
                "--max-new", str(MAX_NEW), "--dtype", "float32", "--max-context", "512"]
        args = ["-m", "strata.cli", *args] if gate is None else stepped.command(gate.path, *args)
        env = {**os.environ, "TERM": "dumb", "PYTHONPATH": ROOT, **env_extra}
        self.child = pexpect.spawn(sys.executable, args, env=env, encoding="utf-8", timeout=300)
        if gate is not None:
            gate.open()
        self.child.expect("you> ")
        self.startup = self.child.before

    def ask(self, line: str) -> tuple[str, tuple[int, int, int, int]]:
        """Sends `line`; returns the answer's text and its footer's (prompt, cached, new, answer)."""
        self.child.sendline(line)
        self.child.expect(FOOTER)
        counts = tuple(int(g) for g in self.child.match.groups())
        shown = self.child.before.split("\r\n", 1)[1]  # after the echoed line
        self.child.expect("you> ")
        return shown.removesuffix("\r\n").replace("\r\n", "\n"), counts

    def command(self, line: str) -> str:
        self.child.sendline(line)
        self.child.expect("you> ")
        return self.child.before.split("\r\n", 1)[1]


@pytest.fixture(scope="module")
def offline(gguf_path) -> LLM:
    return LLM(model=gguf_path, **ENGINE)


def greedy(llm: LLM, messages: list[dict]) -> str:
    return llm.chat(messages, SamplingParams(temperature=0, max_tokens=MAX_NEW))[0].text


def test_chat_turns_cache_regenerate_branch_stop_system(gguf_path, offline, tmp_path):
    # Built from the file, not mapped from the prepared-model cache (which has no bar to show).
    gate = Gate(str(tmp_path / "gate"))
    chat = Chat(gguf_path, gate, STRATA_CACHE_DIR="off")
    assert "loading weights" in chat.startup  # the load's progress bar, on a terminal
    tok = offline.tokenizer
    q1, q2, q3 = "What is the capital of France?", "And of Italy?", "And of Spain?"
    a1, (p1, c1, n1, _) = chat.ask(q1)
    assert a1 == greedy(offline, [{"role": "user", "content": q1}])
    assert (p1, c1, n1) == (len(tok.encode_chat([{"role": "user", "content": q1}])), 0, p1)

    turn2 = [{"role": "user", "content": q1}, {"role": "assistant", "content": a1},
             {"role": "user", "content": q2}]
    a2, (p2, c2, n2, _) = chat.ask(q2)
    assert a2 == greedy(offline, turn2) and p2 == len(tok.encode_chat(turn2))
    assert c2 >= p1 and n2 == p2 - c2  # only the new turn is read

    again, (p2r, _, n2r, _) = chat.ask("/regenerate")
    assert again == a2 and p2r == p2 and n2r <= 1  # the whole prompt was cached

    assert "continuing from turn 1" in chat.command("/branch 1")
    a3, (p3, c3, _, _) = chat.ask(q3)
    assert a3 == greedy(offline, [*turn2[:2], {"role": "user", "content": q3}])
    assert c3 >= p1  # turn 1's K/V is reused by the branch

    history = chat.command("/history")
    assert "1. you: " + q1 in history and "2. you: " + q3 in history and q2 not in history

    # Ctrl-C while an answer streams: it stops, and the chat (and its cache) carries on. The
    # answer gets 3 steps, then its next step waits at the gate until the SIGINT has been
    # handled: it stops after at most 4 steps (of up to 1 + drafts tokens each), never at 32.
    gate.hold()
    chat.child.sendline("Tell me a very long story about a dragon.")
    chat.child.expect("dragon.\r\n")
    gate.steps(3)
    chat.child.expect(r"\w\w")
    chat.child.kill(signal.SIGINT)  # what Ctrl-C on the terminal sends
    gate.release()
    chat.child.expect(STOPPED)
    stopped_prompt, stopped_cached, _, stopped_answer = (int(g) for g in chat.child.match.groups())
    assert stopped_cached >= p3 and stopped_prompt > p3
    assert 1 <= stopped_answer <= 4 * (1 + DEFAULT_SPEC_K) < MAX_NEW
    chat.child.expect("you> ")
    assert "3. you: Tell me a very long story" in chat.command("/history")
    assert "[stopped]" in chat.command("/history")
    _, (_, c4, _, _) = chat.ask("Thanks!")
    assert c4 >= p3  # the conversation before the stopped answer is still cached

    stats = chat.command("/stats")
    assert "chat: 4 turns; 6 answers" in stats and "KV pool:" in stats

    assert "4 later turn(s) dropped" in chat.command("/branch 0")
    system = "Always answer in French."
    assert "system prompt set" in chat.command("/system " + system)
    with_system = [{"role": "system", "content": system}, {"role": "user", "content": q1}]
    a5, (p5, c5, n5, _) = chat.ask(q1)
    assert a5 == greedy(offline, with_system) and p5 == len(tok.encode_chat(with_system))
    assert c5 < p1 // 2 and n5 == p5 - c5  # the prompt differs from its system turn on
    assert "unknown command /frobnicate" in chat.command("/frobnicate")
    chat.child.sendline("/quit")
    chat.child.expect(pexpect.EOF)
    chat.child.close()
    assert chat.child.exitstatus == 0


SAVED = re.compile(r"saved (\d+) turn\(s\) and (\d+) cached tokens")


def rewrite_header(src: str, dst: str, **changes) -> None:
    """Copies the session file `src` to `dst` with header fields changed (checksum recomputed)."""
    with open(src, "rb") as f:
        header, size = read_header(f, src)
        f.seek(size)
        records = f.read()
    with open(dst, "wb") as f:
        f.write(dataclasses.replace(header, **changes).encode() + records)


def test_chat_saves_and_loads_in_a_new_process(gguf_path, tmp_path):
    q1, q2, q3 = "What is the capital of France?", "And of Italy?", "And of Spain?"
    path = str(tmp_path / "chat.strata")
    first = Chat(gguf_path)
    assert "nothing to save yet" in first.command(f"/save {path}")
    a1, _ = first.ask(q1)
    a2, _ = first.ask(q2)
    said = first.command(f"/save {path}")
    assert SAVED.search(said), said
    num_turns, num_saved = (int(g) for g in SAVED.search(said).groups())
    assert num_turns == 2
    gone = str(tmp_path / "gone" / "chat.strata")  # the storage's error, named as the HTTP slots name it
    refused = " ".join(first.command(f"/save {gone}").split())  # the terminal wraps long lines
    assert "error: the directory" in refused and "no longer exists" in refused and "bytes" in refused, refused
    assert not os.path.exists(os.path.dirname(gone))
    a3, (p3, c3, _, _) = first.ask(q3)  # the same process's next turn: what a load must match
    first.child.sendline("/quit")
    first.child.expect(pexpect.EOF)

    with open(path, "rb") as f:
        header = read_header(f, path)[0]
    assert header.num_cells == num_saved and c3 == num_saved
    assert [t["user"] for t in header.metadata["chat"]["turns"]] == [q1, q2]
    other, plain = str(tmp_path / "other.strata"), str(tmp_path / "plain.strata")
    rewrite_header(path, other, fingerprint="0" * 64)
    rewrite_header(path, plain, metadata={})

    second = Chat(gguf_path)
    a0, _ = second.ask("Hello!")
    for bad, said in [(str(tmp_path / "absent.strata"), "cannot be read"),
                      (other, "made by another model"), (plain, "holds no chat"),
                      (str(tmp_path), "cannot be read")]:
        shown = second.command(f"/load {bad}")
        assert said in shown and "the current chat is kept" in shown, shown
    assert "1. you: Hello!" in second.command("/history")

    loaded = second.command(f"/load {path}")
    assert f"loaded 2 turn(s) from {path}; {num_saved} tokens parked" in loaded, loaded
    history = second.command("/history")
    assert "1. you: " + q1 in history and "2. you: " + q2 in history and "Hello!" not in history
    b3, (q3_prompt, q3_cached, q3_new, _) = second.ask(q3)
    assert (b3, q3_prompt, q3_cached) == (a3, p3, num_saved)  # only the new turn is prefilled
    assert q3_new == p3 - num_saved
    second.child.sendline("/quit")
    second.child.expect(pexpect.EOF)
    second.child.close()
    assert second.child.exitstatus == 0


def test_piped_chat_has_no_progress_bar_and_reads_to_eof(gguf_path):
    """Not a terminal: no progress bar; the lines are read as they come, EOF ends the chat."""
    args = [sys.executable, "-m", "strata.cli", "chat", "--model", gguf_path, "--temperature", "0",
            "--max-new", "4", "--dtype", "float32", "--max-context", "256"]
    done = subprocess.run(args, input="/branch 3\n/stats\n", capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "loading weights" not in done.stderr and "tensor" not in done.stderr
    assert "error: turn 3 does not exist (the chat has 0)" in done.stdout
    assert "chat: 0 turns; 0 answers" in done.stdout
