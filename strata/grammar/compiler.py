"""Grammars the output must match, compiled by llguidance, cached by their source.

Chosen by measurement (benchmarks/grammar.py has the libraries' arm): on the default model's
49k vocabulary llguidance compiles a JSON schema in milliseconds (lazily: the lexer grows as
the output needs it), computes a token mask in tens of microseconds, rolls back (a verify
step's drafts), has no dependencies, and reads JSON schemas, regular expressions, Lark and
(converted) llama.cpp GBNF grammars.

Compiling runs where requests are read, off the engine thread (the HTTP handlers' thread
pool); the engine only copies a compiled matcher per request (`CompiledGrammar.matcher`).
A source that does not compile is a `RequestError` naming the field that carried it.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llguidance
from llguidance.gbnf_to_lark import gbnf_to_lark

from strata.errors import RequestError
from strata.grammar.matcher import GrammarMatcher

CACHE_SIZE = 256  # compiled grammars kept (least recently used go first)
# JSON's whitespace between tokens: at most one newline plus a little indentation, so a
# constrained answer cannot fill its budget with blank lines (llguidance's default is unbounded).
JSON_WHITESPACE = r"[\x20\x0A]{0,8}"
KINDS = ("json_schema", "regex", "lark", "gbnf")


@dataclass(frozen=True, eq=False)
class CompiledGrammar:
    """A compiled grammar: every request that uses it gets its own matcher."""

    kind: str
    source: str
    _template: Any  # llguidance.LLMatcher in its start state; only copied
    stop_ids: tuple[int, ...] = ()

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._template.deep_copy(), self.stop_ids)


class GrammarCompiler:
    """One model's grammars. Thread-safe; the tokenizer's tables are built on first use (~1 s)."""

    def __init__(self, tokenizer_json: str, vocab_size: int, stop_ids: Sequence[int]):
        self._tokenizer_json = tokenizer_json
        self._vocab_size = vocab_size
        self._stop_ids = list(stop_ids)
        self._lock = threading.Lock()
        self._lltok: Any = None
        self._cache: OrderedDict[tuple[str, str], CompiledGrammar] = OrderedDict()

    def tokenizer(self) -> Any:
        with self._lock:
            if self._lltok is None:
                self._lltok = llguidance.LLTokenizer(self._tokenizer_json, n_vocab=self._vocab_size,
                                                     eos_token=self._stop_ids or None)
            return self._lltok

    def json_schema(self, schema: Any, param: str) -> CompiledGrammar:
        """The grammar of JSON values matching `schema` (True or {}: any JSON object)."""
        if schema is True or schema == {}:
            schema = {"type": "object"}
        if not isinstance(schema, dict):
            raise RequestError(f"{param} must be a JSON schema object", param=param)
        return self.compile("json_schema", json.dumps(schema, sort_keys=True), param)

    def compile(self, kind: str, source: str, param: str) -> CompiledGrammar:
        """`kind`: json_schema (a JSON text), regex, lark or gbnf (llama.cpp's grammar format)."""
        assert kind in KINDS, kind
        key = (kind, source)
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
                return found
        compiled = CompiledGrammar(kind, source, self._build(kind, source, param), tuple(self._stop_ids))
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _build(self, kind: str, source: str, param: str) -> Any:
        try:
            if kind == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    source, defaults={"whitespace_pattern": JSON_WHITESPACE})
            elif kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(source)
            elif kind == "gbnf":
                grammar = llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(source))
            else:
                grammar = llguidance.LLMatcher.grammar_from_lark(source)
        except Exception as exc:  # noqa: BLE001 - the converters raise their own kinds
            raise RequestError(f"{param}: the {_name(kind)} does not compile: {_first_line(exc)}",
                               param=param, code="invalid_grammar") from None
        tokenizer = self.tokenizer()
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise RequestError(f"{param}: the {_name(kind)} cannot be served: {_first_line(error)}",
                               param=param, code="invalid_grammar")
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise RequestError(f"{param}: the {_name(kind)} cannot be served: {_first_line(matcher.get_error())}",
                               param=param, code="invalid_grammar")
        return matcher


def _name(kind: str) -> str:
    return {"json_schema": "JSON schema", "regex": "regular expression", "lark": "Lark grammar",
            "gbnf": "GBNF grammar"}[kind]


def _first_line(error: object) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = " ".join(lines[:4])
    return text if len(text) <= 300 else text[:297] + "..."
