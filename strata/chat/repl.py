"""The terminal loop of `strata chat`: read a line, run a command or answer it, streaming.

Ctrl-C while an answer streams sets a flag that `stream_answer` reads between engine steps
(a SIGINT handler, so no step is ever interrupted half done); the answer so far is kept as
the turn, marked stopped. Ctrl-C at the prompt clears the line; Ctrl-D or /quit leaves.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TextIO

from strata.chat.answer import AnswerStats, stream_answer
from strata.chat.commands import HELP, Command, CommandError, parse
from strata.chat.history import ChatHistory, Turn
from strata.chat.session import load_chat, save_chat
from strata.engine.interface import Engine
from strata.errors import StrataError
from strata.sampling import SamplingParams

MIB = 1 << 20
PROMPT = "you> "


@dataclass
class ChatTotals:
    num_answers: int = 0
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    last: AnswerStats | None = None

    def add(self, stats: AnswerStats) -> None:
        self.num_answers += 1
        self.num_prompt_tokens += stats.num_prompt_tokens
        self.num_cached_tokens += stats.num_cached_tokens
        self.num_output_tokens += stats.num_output_tokens
        self.last = stats


class StopFlag:
    """Set by SIGINT while an answer streams."""

    def __init__(self) -> None:
        self.is_set = False

    def handle(self, signum: int, frame: object) -> None:
        self.is_set = True


def footer(stats: AnswerStats) -> str:
    prompt = (
        f"prompt {stats.num_prompt_tokens} tokens: {stats.num_cached_tokens} cached, "
        f"{stats.num_new_tokens} new"
    )
    if stats.finish_reason == "abort":
        return f"[stopped | {prompt} | answer {stats.num_output_tokens} tokens so far]"
    t = stats.timings
    speed = f", {t.predicted_per_second:.1f} tok/s | TTFT {t.prompt_ms:.0f} ms" if t else ""
    end = "" if stats.finish_reason == "stop" else f" | ended: {stats.finish_reason}"
    if stats.truncated:
        end += " (the KV pool is full)"
    return f"[{prompt} | answer {stats.num_output_tokens} tokens{speed}{end}]"


class ChatRepl:
    def __init__(
        self,
        engine: Engine,
        params: SamplingParams,
        history: ChatHistory,
        out: TextIO = sys.stdout,
        read: Callable[[str], str] = input,
    ):
        self.engine, self.params, self.history = engine, params, history
        self.out, self.read = out, read
        self.totals = ChatTotals()

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def run(self) -> int:
        self.say("strata chat: /help lists the commands; Ctrl-C stops an answer, /quit leaves.")
        while True:
            try:
                line = self.read(PROMPT)
            except EOFError:
                self.say("")
                return 0
            except KeyboardInterrupt:
                self.say("^C (/quit or Ctrl-D to leave)")
                continue
            try:
                command = parse(line.strip())
            except CommandError as exc:
                self.say(f"error: {exc}")
                continue
            if command.name == "quit":
                return 0
            self.dispatch(command)

    def dispatch(self, command: Command) -> None:
        name = command.name
        if name == "message":
            if command.arg.strip():
                self.answer(command.arg)
        elif name == "regenerate":
            try:
                turn = self.history.pop_last()
            except ValueError as exc:
                self.say(f"error: {exc}")
                return
            if not self.answer(turn.user):
                self.history.turns.append(turn)  # it could not be answered: keep the old one
        elif name == "branch":
            assert command.number is not None
            try:
                dropped = self.history.branch(command.number)
            except ValueError as exc:
                self.say(f"error: {exc}")
                return
            self.say(
                f"continuing from turn {command.number} ({len(dropped)} later turn(s) dropped); "
                f"the next message is turn {command.number + 1}"
            )
        elif name == "history":
            self.show_history()
        elif name == "system":
            self.history.system = command.arg or None
            self.say(f"system prompt {'set' if command.arg else 'cleared'} (from the next answer on)")
        elif name == "stats":
            self.show_stats()
        elif name == "save":
            self.save(command.arg)
        elif name == "load":
            self.load(command.arg)
        elif name == "help":
            self.say(HELP)

    def answer(self, user: str) -> bool:
        """Answers `user` after the chat so far; False when it could not be asked at all."""
        try:
            prompt_ids = self.engine.tokenizer.encode_chat(self.history.messages(user))
        except StrataError as exc:
            self.say(f"error: {exc}")
            return False
        params = self.params
        if params.seed is not None:  # a new answer each time, reproducible as a whole chat
            params = replace(params, seed=params.seed + self.totals.num_answers)
        flag = StopFlag()
        previous = signal.signal(signal.SIGINT, flag.handle)
        try:
            stats = stream_answer(
                self.engine, prompt_ids, params, self._stream, lambda: flag.is_set
            )
        except StrataError as exc:
            self.say(f"\nerror: {exc}")
            return False
        finally:
            signal.signal(signal.SIGINT, previous)
        self.history.turns.append(Turn(user, stats.text, stopped=stats.finish_reason == "abort"))
        self.totals.add(stats)
        self.say("")
        self.say(footer(stats))
        return True

    def save(self, path: str) -> None:
        try:
            saved = save_chat(self.engine, self.history, path)
        except (StrataError, ValueError, OSError) as exc:
            self.say(f"error: {exc}")
            return
        self.say(f"saved {saved.num_turns} turn(s) and {saved.num_cells} cached tokens to {path} "
                 f"({saved.num_bytes / MIB:.1f} MiB)")

    def load(self, path: str) -> None:
        """Replaces the chat with the file's; on any error the current chat stays as it was."""
        try:
            loaded = load_chat(self.engine, path)
        except (StrataError, OSError) as exc:
            self.say(f"error: {exc} (the current chat is kept)")
            return
        self.history = loaded.history
        self.say(f"loaded {len(loaded.history.turns)} turn(s) from {path}; {loaded.num_cells} "
                 f"tokens parked in the cache (the next message prefills only its new tokens)")

    def _stream(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def show_history(self) -> None:
        if self.history.system:
            self.say(f"system: {_short(self.history.system)}")
        if not self.history.turns:
            self.say("(no turns yet)")
        for i, turn in enumerate(self.history.turns, 1):
            mark = " [stopped]" if turn.stopped else ""
            self.say(f"{i}. you: {_short(turn.user)}\n   strata: {_short(turn.assistant)}{mark}")

    def show_stats(self) -> None:
        t = self.totals
        computed = t.num_prompt_tokens - t.num_cached_tokens
        share = 100 * t.num_cached_tokens / t.num_prompt_tokens if t.num_prompt_tokens else 0.0
        self.say(
            f"chat: {len(self.history.turns)} turns; {t.num_answers} answers; prompt tokens "
            f"{t.num_prompt_tokens}: {t.num_cached_tokens} cached, {computed} computed "
            f"({share:.0f}% reused); {t.num_output_tokens} answer tokens"
        )
        if t.last is not None and t.last.timings is not None:
            lt = t.last.timings
            self.say(
                f"last answer: TTFT {lt.prompt_ms:.0f} ms, prefill {lt.prompt_per_second:.1f} "
                f"tok/s, decode {lt.predicted_per_second:.1f} tok/s"
            )
        snap = self.engine.snapshot()
        p = snap.pool
        held_mib = snap.kv_bytes_held / MIB
        self.say(
            f"KV pool: {p.num_chunks_held} of {p.num_chunks_total} chunks of {p.chunk_size} "
            f"cells held ({held_mib:.1f} MiB), {p.num_chunks_parked} of them by idle "
            f"conversations, {p.num_conversations_parked} parked"
        )


def _short(text: str, limit: int = 70) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
