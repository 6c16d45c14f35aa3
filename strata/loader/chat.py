"""Chat templates: validate OpenAI-style messages and render them with the model's jinja template.

Rendering follows transformers' `apply_chat_template` so that the same conversation becomes the
same prompt text: a sandboxed jinja environment with `trim_blocks` and `lstrip_blocks`, the
`loopcontrols` extension, a `{% generation %}` block that renders its body, the `raise_exception`
and `strftime_now` globals, a `tojson` filter that does not escape HTML or non-ASCII, and the
variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token` plus caller extras.

Message rules (checked before rendering, failures are `RequestError`s naming the field):
- `messages` is a non-empty list of dicts.
- `role` is `system`, `user` or `assistant`; `developer` (OpenAI's newer name) becomes `system`;
  `tool` passes through only when the template mentions the word "tool", since a template that
  never handles it would render it as an ordinary turn the model was not trained on.
- `content` is a string or a list of `{"type": "text", "text": str}` parts, joined with "\n";
  any other part type (images, audio) is refused. An assistant turn that carries `tool_calls`
  may omit `content`.
- `name`, `tool_calls` and `tool_call_id` pass through untouched; other keys are dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from strata.errors import LoaderError, RequestError

ROLES = ("system", "user", "assistant", "tool")
# Literal end-of-turn markers: when a chat template writes one, generation should stop on it.
END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")
PASSTHROUGH_KEYS = ("name", "tool_calls", "tool_call_id")
PART_SEPARATOR = "\n"


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text (for training masks);
    here it just renders its body."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body)
        return call.set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return str(caller())


class _SafeNamespace(jinja2.utils.Namespace):
    """jinja's `namespace()`, refusing underscore names so a template cannot reach internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # jinja's own trick: `self` may be a kwarg
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        super().__setitem__(name, value)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _SafeNamespace
    return env


def _content_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for j, part in enumerate(content):
            where = f"{param}[{j}]"
            if not isinstance(part, Mapping):
                raise RequestError(f"{where} must be an object, got {type(part).__name__}",
                                   param=where)
            kind = part.get("type")
            if kind != "text":
                raise RequestError(
                    f"{where} has type {kind!r}; this model only accepts text parts", param=where)
            text = part.get("text")
            if not isinstance(text, str):
                raise RequestError(f"{where}.text must be a string", param=f"{where}.text")
            texts.append(text)
        return PART_SEPARATOR.join(texts)
    raise RequestError(
        f"{param} must be a string or a list of text parts, got {type(content).__name__}",
        param=param)


def normalize_messages(messages: Any, template_source: str = "") -> list[dict[str, Any]]:
    """Validated plain copies of `messages` (see the module doc); the input is not modified."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise RequestError("messages must be a list of message objects", param="messages")
    if not messages:
        raise RequestError("messages must not be empty", param="messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise RequestError(f"{where} must be an object, got {type(message).__name__}",
                               param=where)
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role not in ROLES:
            raise RequestError(
                f"{where}.role is {role!r}; expected one of {', '.join(ROLES)}",
                param=f"{where}.role")
        if role == "tool" and "tool" not in template_source:
            raise RequestError(
                f"{where}.role is 'tool' but this model's chat template has no tool support",
                param=f"{where}.role")
        plain: dict[str, Any] = {"role": role}
        content = message.get("content")
        if content is None:
            if not (role == "assistant" and message.get("tool_calls")):
                raise RequestError(f"{where}.content is required", param=f"{where}.content")
        else:
            plain["content"] = _content_text(content, f"{where}.content")
        for key in PASSTHROUGH_KEYS:
            if message.get(key) is not None:
                plain[key] = message[key]
        out.append(plain)
    return out


class ChatTemplate:
    """One compiled chat template. Compiling happens once, here; rendering is thread-safe."""

    def __init__(self, source: str, *, bos_token: str | None = None,
                 eos_token: str | None = None, origin: str = "chat template"):
        if not isinstance(source, str) or not source.strip():
            raise LoaderError(f"{origin}: the chat template is empty or not a string")
        try:
            self._template = _make_environment().from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise LoaderError(f"{origin}: the chat template does not compile: {exc}") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: Any, add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The prompt text for `messages`; bad messages or a template refusal: `RequestError`."""
        plain = normalize_messages(messages, self.source)
        variables: dict[str, Any] = dict(kwargs)
        if self.bos_token is not None:
            variables.setdefault("bos_token", self.bos_token)
        if self.eos_token is not None:
            variables.setdefault("eos_token", self.eos_token)
        variables["messages"] = plain
        variables["add_generation_prompt"] = bool(add_generation_prompt)
        try:
            return self._template.render(**variables)
        except jinja2.exceptions.TemplateError as exc:
            raise RequestError(
                f"the model's chat template refused the conversation: {exc}",
                param="messages") from exc


def pick_template(value: Any, origin: str) -> str | None:
    """A config's `chat_template`: a string, or a list of {"name", "template"} (take "default")."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        chosen = named.get("default")
        if chosen is None or isinstance(chosen, str):
            return chosen
    raise LoaderError(f"{origin} must be a string or a list of named templates")


def end_of_turn_markers(template: str | None) -> list[str]:
    """The end-of-turn markers that `template` writes literally."""
    return [m for m in END_OF_TURN_MARKERS if m in (template or "")]


def no_template_error() -> RequestError:
    """What a caller gets when the model has no chat template (it may fall back to a raw prompt)."""
    return RequestError(
        "this model has no chat template; send a raw prompt (completions) instead of messages",
        param="messages")
