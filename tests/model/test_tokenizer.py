"""The tokenizer and chat template of the default model, checked against transformers.

transformers rebuilds the tokenizer from the same GGUF file on its own; every id and every
rendered prompt here must equal its answer.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest

from tests.conftest import require, require_default_model

GGUF_PATH = require_default_model()
MODEL_DIR, GGUF_NAME = os.path.split(GGUF_PATH)

gguf = require("gguf")
transformers = require("transformers")
tokenizers = require("tokenizers")

from strata.errors import LoaderError, RequestError
from strata.loader.tokenizer import Tokenizer

TEXTS = {
    "ascii": "Hello world! The quick brown fox jumps over the lazy dog.",
    "accents": "Café naïve résumé — “quotes” über façade",
    "cjk": "日本語のテキスト、中文文本。한국어 텍스트",
    "emoji": "emoji 🎉👍🏽 family 👨‍👩‍👧 flag 🇫🇷",
    "arabic": "مرحبا بالعالم",
    "whitespace": "  two   three    four\t\ttabs \u00a0nbsp ",
    "newlines": "line one\n\n\nline two\r\nline three\n",
    "digits": "Numbers 1234567 and 3.14159, 2024-01-01, 1,000,000",
    "code": "def f(x):\n    return x**2  # comment\n\nprint(f(3) != {'a': [1, 2]})\n",
    "contractions": "I'm you're they'll we'd IT'S",
    "specials": "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "special_inline": "text<|im_end|>more <repo_name> x<|im_start|>",
    "special_broken": "<|im_start|not quite<|im_end",
    "empty": "",
    "space": " ",
}

CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "What is the capital of France?"}],
    "with_system": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three colours."},
    ],
    "multi_turn": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Count to 5.\nThen stop."},
    ],
    "non_ascii": [
        {"role": "system", "content": "Réponds en français. 日本語も可。"},
        {"role": "user", "content": "Ça va ? 🙂 مرحبا"},
    ],
}


@pytest.fixture(scope="module")
def reader() -> Any:
    return gguf.GGUFReader(GGUF_PATH)


@pytest.fixture(scope="module")
def ours(reader: Any) -> Tokenizer:
    return Tokenizer.from_gguf(reader, GGUF_PATH)


@pytest.fixture(scope="module")
def ref() -> Any:
    return transformers.AutoTokenizer.from_pretrained(MODEL_DIR, gguf_file=GGUF_NAME)


@pytest.fixture(scope="module")
def saved_dir(ours: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("smollm2_tokenizer"))
    ours.save_hf(path)
    return path


class _Field:
    def __init__(self, value: Any):
        self.value = value

    def contents(self) -> Any:
        return self.value


class _PatchedReader:
    """The real reader's fields with some replaced (a value of None removes the field)."""

    def __init__(self, base: Any, **overrides: Any):
        self.fields = dict(base.fields)
        for key, value in overrides.items():
            key = key.replace("__", ".")
            if value is None:
                self.fields.pop(key, None)
            else:
                self.fields[key] = _Field(value)


def _ref_ids(ref: Any, conversation: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    out = ref.apply_chat_template(conversation, tokenize=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_metadata_matches(ours: Tokenizer, ref: Any) -> None:
    assert ours.vocab_size == len(ref) == 49152
    assert ours.bos_token_id == ref.bos_token_id == 1
    assert ours.eos_token_ids == (ref.eos_token_id,) == (2,)
    assert ours.id_to_token(2) == "<|im_end|>" and ours.token_to_id("<|im_start|>") == 1
    assert ours.add_bos is False
    for token in ("Hello", "Ġworld", "Ċ", "<|endoftext|>", "<repo_name>"):
        assert ours.token_to_id(token) == ref.convert_tokens_to_ids(token)
    assert ours.token_to_id("no-such-token-xyz") is None
    assert ours.is_special(0) and ours.is_special(2)
    assert not ours.is_special(ours.token_to_id("Hello"))


@pytest.mark.parametrize("name", list(TEXTS))
def test_ids_match_transformers(ours: Tokenizer, ref: Any, name: str) -> None:
    text = TEXTS[name]
    ids = ours.encode(text)
    assert ids == ref.encode(text)
    assert ours.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == ref.decode(ids) == text
    assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)


def test_special_tokens_are_single_ids(ours: Tokenizer) -> None:
    assert ours.encode("<|im_start|>") == [1]
    assert ours.encode("a<|im_end|>b") == [ours.encode("a")[0], 2, ours.encode("b")[0]]
    assert ours.decode([1, 2], skip_special_tokens=True) == ""


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_chat_prompt_matches_transformers(ours: Tokenizer, ref: Any, name: str) -> None:
    conv = CONVERSATIONS[name]
    text = ours.render_chat(conv)
    assert text == ref.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    assert ours.encode_chat(conv) == _ref_ids(ref, conv, add_generation_prompt=True)
    closed = ours.render_chat(conv, add_generation_prompt=False)
    assert closed == ref.apply_chat_template(conv, tokenize=False, add_generation_prompt=False)
    assert text.endswith("<|im_start|>assistant\n") and not closed.endswith("assistant\n")


def test_text_parts_are_joined(ours: Tokenizer) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "one"},
                                          {"type": "text", "text": "two"}]}]
    assert ours.render_chat(parts) == ours.render_chat([{"role": "user", "content": "one\ntwo"}])
    developer = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert ours.render_chat(developer) == ours.render_chat(system)


@pytest.mark.parametrize("messages, param", [
    ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
    ([{"role": "user", "content": 42}], "messages[0].content"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "messages[0].content[0]"),
    ([{"role": "user", "content": "ok"}, "not a dict"], "messages[1]"),
    ([{"role": "tool", "content": "42", "tool_call_id": "c1"}], "messages[0].role"),
    ([], "messages"),
    ("hello", "messages"),
])
def test_bad_messages_are_request_errors(ours: Tokenizer, messages: Any, param: str) -> None:
    with pytest.raises(RequestError) as err:
        ours.render_chat(messages)
    assert err.value.param == param and err.value.code == "invalid_request_error"


def test_template_errors_are_request_errors(ours: Tokenizer) -> None:
    strict = Tokenizer(ours.backend, chat_template="{{ raise_exception('roles must alternate') }}")
    with pytest.raises(RequestError, match="roles must alternate"):
        strict.render_chat([{"role": "user", "content": "hi"}])
    with pytest.raises(RequestError, match="no chat template"):
        Tokenizer(ours.backend).render_chat([{"role": "user", "content": "hi"}])
    with pytest.raises(LoaderError, match="does not compile"):
        Tokenizer(ours.backend, chat_template="{% for %}")


def test_tool_turns_pass_when_the_template_handles_them(ours: Tokenizer) -> None:
    template = ("{% for m in messages %}{% if m.role == 'tool' %}[tool {{ m.tool_call_id }}: "
                "{{ m.content }}]{% elif m.tool_calls %}[calls {{ m.tool_calls | tojson }}]"
                "{% else %}[{{ m.role }}: {{ m.content }}]{% endif %}{% endfor %}"
                "{{ strftime_now('%Y') | length }}")
    tok = Tokenizer(ours.backend, chat_template=template)
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    text = tok.render_chat([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ])
    assert text == f"[user: go][calls {json.dumps(calls)}][tool c1: 42]4"


def test_bos_is_added_once_when_asked(ours: Tokenizer) -> None:
    template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tok = Tokenizer(ours.backend, bos_token_id=1, eos_token_ids=[2], add_bos=True,
                    chat_template=template)
    assert tok.encode("hi") == [1, *ours.encode("hi")]
    assert tok.encode("hi", add_special_tokens=False) == ours.encode("hi")
    assert tok.encode_chat([{"role": "user", "content": "hi"}]) == [1, *ours.encode("hi")]
    with pytest.raises(LoaderError, match="BOS"):
        Tokenizer(ours.backend, add_bos=True)


def test_hf_dir_round_trip(ours: Tokenizer, saved_dir: str) -> None:
    again = Tokenizer.from_hf_dir(saved_dir)
    assert (again.vocab_size, again.bos_token_id, again.eos_token_ids, again.add_bos) == (
        ours.vocab_size, ours.bos_token_id, ours.eos_token_ids, ours.add_bos)
    assert again.chat_template == ours.chat_template
    for text in TEXTS.values():
        assert again.encode(text) == ours.encode(text)
    for conv in CONVERSATIONS.values():
        assert again.encode_chat(conv) == ours.encode_chat(conv)
    assert [again.is_special(i) for i in range(20)] == [ours.is_special(i) for i in range(20)]


def test_saved_dir_loads_in_transformers(ours: Tokenizer, saved_dir: str) -> None:
    ref_saved = transformers.AutoTokenizer.from_pretrained(saved_dir)
    for text in TEXTS.values():
        assert ref_saved.encode(text) == ours.encode(text)
    conv = CONVERSATIONS["multi_turn"]
    assert ref_saved.apply_chat_template(conv, tokenize=False, add_generation_prompt=True) == \
        ours.render_chat(conv)


def test_hf_dir_chat_template_file_wins(saved_dir: str, tmp_path: Any) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(saved_dir, name), tmp_path / name)
    template = "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    (tmp_path / "chat_template.jinja").write_text(template)
    tok = Tokenizer.from_hf_dir(str(tmp_path))
    assert tok.render_chat([{"role": "user", "content": "x"}]) == "[x]"


def test_hf_dir_bos_and_eos_sources(ours: Tokenizer, tmp_path: Any) -> None:
    """No add_bos_token: follow the post-processor; EOS also from generation_config.json."""
    from tokenizers import processors

    backend = tokenizers.Tokenizer.from_str(ours.backend.to_str())
    backend.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {"bos_token": "<|endoftext|>", "eos_token": {"content": "<|im_end|>"}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    tok = Tokenizer.from_hf_dir(str(tmp_path))
    assert (tok.add_bos, tok.bos_token_id, tok.eos_token_ids) == (True, 0, (2, 5))
    assert tok.encode("hi") == [0, *ours.encode("hi")] and tok.chat_template is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(dict(config, add_bos_token=False)))
    assert Tokenizer.from_hf_dir(str(tmp_path)).encode("hi") == ours.encode("hi")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|nope|>"}))
    with pytest.raises(LoaderError, match=r"tokenizer_config\.json: eos_token"):
        Tokenizer.from_hf_dir(str(tmp_path))


def test_missing_tokenizer_json_names_it(tmp_path: Any) -> None:
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(LoaderError, match=r"tokenizer\.json is missing") as err:
        Tokenizer.from_hf_dir(str(tmp_path))
    assert str(tmp_path) in str(err.value)


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_other_pre_tokenizers_match_transformers(reader: Any, pre: str) -> None:
    """The same vocabulary under other `tokenizer.ggml.pre` splits, against transformers' own."""
    convert = require("transformers.integrations.gguf.gguf_tokenizer_mapping", "convert_gguf_tokenizer")
    fields = {k: reader.fields[f"tokenizer.ggml.{k}"].contents()
              for k in ("tokens", "merges", "token_type")}
    backend, _ = convert("llama", dict(fields, tokenizer_type="gpt2", pre_tokenizer_type=pre))
    ours = Tokenizer.from_gguf(_PatchedReader(reader, tokenizer__ggml__pre=pre), GGUF_PATH)
    for text in TEXTS.values():
        assert ours.encode(text) == backend.encode(text, add_special_tokens=False).ids, text
        # This vocabulary never merges digits, so compare the splits too (llama-bpe groups
        # digits by three, qwen2 splits them one by one).
        assert ours.backend.pre_tokenizer.pre_tokenize_str(text) == \
            backend.pre_tokenizer.pre_tokenize_str(text), text


@pytest.mark.parametrize("overrides, match", [
    ({"tokenizer__ggml__pre": "mystery"}, "tokenizer.ggml.pre 'mystery'"),
    ({"tokenizer__ggml__model": "bert"}, "tokenizer.ggml.model 'bert'"),
    ({"tokenizer__ggml__model": "llama"}, "tokenizer.ggml.scores is missing"),
    ({"tokenizer__ggml__add_bos_token": 1}, "tokenizer.ggml.add_bos_token"),
    ({"tokenizer__ggml__model": None}, "tokenizer.ggml.model"),
    ({"tokenizer__ggml__merges": None}, "tokenizer.ggml.merges"),
    ({"tokenizer__ggml__bos_token_id": 10**6}, "tokenizer.ggml.bos_token_id"),
    ({"tokenizer__ggml__token_type": [1, 1]}, "tokenizer.ggml.token_type"),
])
def test_bad_gguf_metadata_is_a_loader_error(reader: Any, overrides: dict[str, Any],
                                             match: str) -> None:
    with pytest.raises(LoaderError, match=match.replace(".", r"\.")):
        Tokenizer.from_gguf(_PatchedReader(reader, **overrides), GGUF_PATH)


def test_gguf_end_of_turn_ids_are_stop_ids(reader: Any) -> None:
    tok = Tokenizer.from_gguf(_PatchedReader(reader, tokenizer__ggml__eot_token_id=0), GGUF_PATH)
    assert tok.eos_token_ids == (2, 0)


# A template in the common multi-line style: the output depends on trim_blocks/lstrip_blocks,
# namespace(), loop controls and the tojson filter behaving as in transformers.
STYLED_TEMPLATE = """{%- set ns = namespace(system='') -%}
{% for message in messages %}
    {% if message['role'] == 'system' %}
        {% set ns.system = message['content'] %}
        {% continue %}
    {% endif %}
    <{{ message['role'] }}>{{ message['content'] | tojson }}
    {% if loop.last and ns.system %}
        (system: {{ ns.system }}) {{ eos_token }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
    <assistant>
{% endif %}"""


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_styled_template_matches_transformers(ours: Tokenizer, ref: Any, name: str) -> None:
    conv = CONVERSATIONS[name]
    styled = Tokenizer(ours.backend, bos_token_id=1, eos_token_ids=[2],
                       chat_template=STYLED_TEMPLATE)
    expected = ref.apply_chat_template(conv, chat_template=STYLED_TEMPLATE, tokenize=False,
                                       add_generation_prompt=True)
    assert styled.render_chat(conv) == expected
