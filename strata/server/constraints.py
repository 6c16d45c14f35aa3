"""Structured outputs: the one grammar a request's answer must match, from whichever field named it.

- OpenAI's `response_format`: `text` (none), `json_object` (any JSON object; llama.cpp's
  `schema` inside it too), `json_schema` (`json_schema.schema`, with `strict` or not: the
  answer always matches the schema; `strict: false` is no looser);
- vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`) and its
  older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` (Lark, or GBNF when
  it has `::=` rules);
- llama.cpp's `json_schema` and `grammar` (GBNF).

At most one of them per request; two are a 400 naming the second. A grammar that does not
compile is a 400 naming its field (strata/grammar/compiler.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

from strata.errors import RequestError
from strata.grammar.compiler import CompiledGrammar, GrammarCompiler

STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")


def _choice_regex(choices: Any, param: str) -> str:
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise RequestError(f"{param} must be a non-empty list of non-empty strings", param=param)
    return "(" + "|".join(re.escape(c) for c in choices) + ")"


def _grammar_kind(source: Any, param: str) -> str:
    if not isinstance(source, str) or not source.strip():
        raise RequestError(f"{param} must be a non-empty grammar text", param=param)
    return "gbnf" if "::=" in source else "lark"


def _from_response_format(fmt: Any, compiler: GrammarCompiler) -> CompiledGrammar | None:
    kind = fmt.type
    if kind == "text":
        if fmt.json_schema is not None or fmt.schema_ is not None:
            raise RequestError("response_format: a schema needs type 'json_schema'", param="response_format.type")
        return None
    if kind == "json_object":
        return compiler.json_schema(fmt.schema_ if fmt.schema_ is not None else True, "response_format.schema")
    if kind == "json_schema":
        spec = fmt.json_schema
        if spec is None:
            raise RequestError("response_format.json_schema is required with type 'json_schema'",
                               param="response_format.json_schema")
        schema = spec.schema_ if spec.schema_ is not None else True
        return compiler.json_schema(schema, "response_format.json_schema.schema")
    raise RequestError(f"response_format type {kind!r} is not supported (text, json_object, json_schema)",
                       param="response_format.type", code="unsupported_parameter")


def _from_structured(value: dict[str, Any], compiler: GrammarCompiler, param: str) -> CompiledGrammar | None:
    given = [k for k in value if value[k] not in (None, False)]
    unknown = [k for k in value if k not in STRUCTURED_KEYS]
    if unknown:
        raise RequestError(f"{param}.{unknown[0]} is not supported (one of {', '.join(STRUCTURED_KEYS)})",
                           param=f"{param}.{unknown[0]}", code="unsupported_parameter")
    if len(given) > 1:
        raise RequestError(f"{param}: give one of {', '.join(given)}", param=f"{param}.{given[1]}")
    if not given:
        return None
    key = given[0]
    return _one(key, value[key], compiler, f"{param}.{key}")


def _one(key: str, value: Any, compiler: GrammarCompiler, param: str) -> CompiledGrammar:
    if key in ("json", "guided_json", "json_schema"):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise RequestError(f"{param} must be a JSON schema (an object, or its JSON text)", param=param) from None
        return compiler.json_schema(value, param)
    if key == "json_object":
        return compiler.json_schema(True, param)
    if key in ("regex", "guided_regex"):
        if not isinstance(value, str) or not value:
            raise RequestError(f"{param} must be a non-empty regular expression", param=param)
        return compiler.compile("regex", value, param)
    if key in ("choice", "guided_choice"):
        return compiler.compile("regex", _choice_regex(value, param), param)
    assert key in ("grammar", "guided_grammar"), key
    return compiler.compile(_grammar_kind(value, param), value, param)


def grammar_of(req: Any, compiler: GrammarCompiler) -> CompiledGrammar | None:
    """The grammar a chat or completion request asks for, compiled (cached); None: free text."""
    found: list[tuple[str, CompiledGrammar | None]] = []
    fmt = getattr(req, "response_format", None)
    if fmt is not None:
        found.append(("response_format", _from_response_format(fmt, compiler)))
    if req.structured_outputs is not None:
        found.append(("structured_outputs", _from_structured(req.structured_outputs, compiler, "structured_outputs")))
    for key in ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "json_schema", "grammar"):
        value = getattr(req, key)
        if value is not None:
            found.append((key, _one(key, value, compiler, key)))
    asked = [(k, g) for k, g in found if g is not None]
    if len(asked) > 1:
        raise RequestError(f"{asked[1][0]}: the answer is already held to {asked[0][0]}; give one of them",
                           param=asked[1][0])
    return asked[0][1] if asked else None
