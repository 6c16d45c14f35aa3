"""The model's tokenizer: a HF `tokenizers.Tokenizer` plus BOS/EOS ids and the chat template.

Built from a GGUF file's `tokenizer.*` metadata (byte-level BPE, `tokenizer.ggml.model == "gpt2"`)
or from a Hugging Face directory (`tokenizer.json` + `tokenizer_config.json`).

Invariants:
- `encode` runs the backend without its post-processor; BOS is added here, and only when
  `add_bos` is set, so `add_bos` alone decides whether encode adds BOS (never EOS).
- Special tokens (GGUF control tokens, HF added tokens with `special=True`) and GGUF user-defined
  tokens are matched whole wherever they appear in text, as HF added tokens are.
- Every id held here (`bos_token_id`, `eos_token_ids`) is inside the vocabulary.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from strata.errors import LoaderError
from strata.loader.chat import ChatTemplate, end_of_turn_markers, no_template_error, pick_template

# llama.cpp's token types (gguf.TokenType) that matter here.
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# `tokenizer.ggml.pre` -> how text is split before BPE, as in llama.cpp; a name not here is refused.
_PRE_SPLITS = {
    "gpt2": "gpt2", "default": "gpt2", "mpt": "gpt2", "olmo": "gpt2",
    "smollm": "digits+gpt2", "starcoder": "digits+gpt2", "refact": "digits+gpt2",
    "llama-bpe": "llama3", "llama3": "llama3", "llama-v3": "llama3",
    "qwen2": "qwen2", "deepseek-r1-qwen": "qwen2", "stablelm2": "qwen2",
}


def _pre_tokenizer(split: str) -> pre_tokenizers.PreTokenizer:
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if split == "gpt2":
        return gpt2
    if split == "digits+gpt2":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2])
    pattern = _LLAMA3_SPLIT if split == "llama3" else _QWEN2_SPLIT
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


class Tokenizer:
    """Text <-> token ids for one model, and its chat prompt."""

    def __init__(self, backend: tokenizers.Tokenizer, *, bos_token_id: int | None = None,
                 eos_token_ids: Iterable[int] = (), add_bos: bool = False,
                 chat_template: str | None = None, source: str = "tokenizer"):
        self.backend = backend
        self.source = source
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        eos_token_ids = list(eos_token_ids)
        for name, ids in (("bos_token_id", [bos_token_id]), ("eos_token_ids", eos_token_ids)):
            for i in ids:
                if i is not None and not (isinstance(i, int) and 0 <= i < self.vocab_size):
                    raise LoaderError(f"{source}: {name} {i!r} is not a token id "
                                      f"below the vocabulary size {self.vocab_size}")
        if add_bos and bos_token_id is None:
            raise LoaderError(f"{source}: the tokenizer asks for BOS but names no BOS token")
        self.bos_token_id: int | None = bos_token_id
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_token_ids))
        self.add_bos: bool = bool(add_bos)
        self._special_ids = frozenset(
            i for i, tok in backend.get_added_tokens_decoder().items() if tok.special)
        self.chat_template: str | None = chat_template
        self._chat: ChatTemplate | None = None
        if chat_template is not None:
            bos, eos = bos_token_id, (self.eos_token_ids or (None,))[0]
            self._chat = ChatTemplate(
                chat_template, origin=f"{source}: chat template",
                bos_token=None if bos is None else self.id_to_token(bos),
                eos_token=None if eos is None else self.id_to_token(eos))

    @classmethod
    def from_parts(cls, backend: tokenizers.Tokenizer, **kwargs: Any) -> Tokenizer:
        """Same as the constructor; reads better where a backend is built by hand."""
        return cls(backend, **kwargs)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special-token spellings in it become single ids."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        ids: list[int] = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos:
            assert self.bos_token_id is not None  # checked in __init__
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def render_chat(self, messages: Any, add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The prompt text for `messages`; RequestError if they are malformed or no template."""
        if self._chat is None:
            raise no_template_error()
        return self._chat.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)

    def encode_chat(self, messages: Any, add_generation_prompt: bool = True,
                    **kwargs: Any) -> list[int]:
        """Ids of the rendered prompt. Templates write their own BOS (as transformers assumes);
        one is added only when the model asks for BOS and the template did not write it."""
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt, **kwargs)
        ids = self.encode(text, add_special_tokens=False)
        if self.add_bos and ids[:1] != [self.bos_token_id]:
            assert self.bos_token_id is not None
            ids.insert(0, self.bos_token_id)
        return ids

    @classmethod
    def from_gguf(cls, reader: Any, source: str) -> Tokenizer:
        """Rebuild the tokenizer from a `gguf.GGUFReader`'s metadata; `source` names the file."""
        def field(key: str) -> Any:
            return _gguf_field(reader, key, source)

        kind = field("tokenizer.ggml.model")
        if kind != "gpt2":
            why = " (SentencePiece vocabularies are not implemented yet)" if kind == "llama" else ""
            raise LoaderError(f"{source}: tokenizer.ggml.model {kind!r} is not supported{why}; "
                              "only 'gpt2' (byte-level BPE) is")
        tokens, merges = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.merges")
        for key, value in (("tokens", tokens), ("merges", merges)):
            if not isinstance(value, list) or not value:
                raise LoaderError(f"{source}: GGUF field tokenizer.ggml.{key} is missing or empty")
        types = field("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
        if len(types) != len(tokens):
            raise LoaderError(f"{source}: tokenizer.ggml.token_type has {len(types)} entries, "
                              f"tokenizer.ggml.tokens has {len(tokens)}")
        pre = field("tokenizer.ggml.pre") or "default"
        if pre not in _PRE_SPLITS:
            raise LoaderError(f"{source}: tokenizer.ggml.pre {pre!r} is not supported; "
                              f"known: {', '.join(sorted(_PRE_SPLITS))}")
        backend = _byte_level_backend(tokens, types, merges, _PRE_SPLITS[pre], source)
        ids = {k: field(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "eot", "eom")}
        for k, v in ids.items():
            if v is not None and not (isinstance(v, int) and 0 <= v < len(tokens)):
                raise LoaderError(f"{source}: tokenizer.ggml.{k}_token_id {v!r} is not an id "
                                  f"in the {len(tokens)}-token vocabulary")
        template = field("tokenizer.chat_template")
        eos_ids = [ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None]
        return cls(backend, bos_token_id=ids["bos"],
                   eos_token_ids=eos_ids + _end_of_turn_ids(backend, template),
                   add_bos=bool(field("tokenizer.ggml.add_bos_token")),
                   chat_template=template, source=source)

    @classmethod
    def from_hf_dir(cls, path: str) -> Tokenizer:
        """Load `tokenizer.json` (required), `tokenizer_config.json`, `chat_template.jinja`,
        and the EOS ids of `generation_config.json` / `config.json` where present."""
        tok_file = os.path.join(path, "tokenizer.json")
        cfg_file = os.path.join(path, "tokenizer_config.json")
        if not os.path.isfile(tok_file):
            raise LoaderError(f"{tok_file}: tokenizer.json is missing")
        try:
            backend = tokenizers.Tokenizer.from_file(tok_file)
        except Exception as exc:
            raise LoaderError(f"{tok_file}: cannot parse: {exc}") from exc
        config = _read_json(cfg_file)
        model_cfg = _read_json(os.path.join(path, "config.json"))
        gen_cfg = _read_json(os.path.join(path, "generation_config.json"))
        bos = _named_id(backend, config, "bos_token", cfg_file)
        if bos is None and isinstance(model_cfg.get("bos_token_id"), int):
            bos = model_cfg["bos_token_id"]
        eos_ids = [_named_id(backend, config, "eos_token", cfg_file)]
        for extra in (gen_cfg.get("eos_token_id"), model_cfg.get("eos_token_id")):
            eos_ids += extra if isinstance(extra, list) else [extra]
        add_bos = config.get("add_bos_token")
        if not isinstance(add_bos, bool):  # not stated: follow what the post-processor does
            probe = [backend.encode("a", add_special_tokens=s).ids[:1] for s in (True, False)]
            add_bos = bos is not None and probe[0] == [bos] != probe[1]
        template = pick_template(config.get("chat_template"), f"{cfg_file}: chat_template")
        jinja_file = os.path.join(path, "chat_template.jinja")
        if os.path.isfile(jinja_file):
            with open(jinja_file, encoding="utf-8") as f:
                template = f.read()
        eos_ids = [i for i in eos_ids if isinstance(i, int)] + _end_of_turn_ids(backend, template)
        return cls(backend, bos_token_id=bos, eos_token_ids=eos_ids, add_bos=add_bos,
                   chat_template=template, source=path)

    def save_hf(self, path: str) -> None:
        """Write `tokenizer.json` and `tokenizer_config.json` so `from_hf_dir` (or transformers)
        gives back the same ids, BOS rule and chat template."""
        os.makedirs(path, exist_ok=True)
        self.backend.save(os.path.join(path, "tokenizer.json"))
        bos = None if self.bos_token_id is None else self.id_to_token(self.bos_token_id)
        eos = self.id_to_token(self.eos_token_ids[0]) if self.eos_token_ids else None
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": bos, "eos_token": eos,
            "add_bos_token": self.add_bos, "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "chat_template": self.chat_template,
        }
        with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=2)


def _byte_level_backend(tokens: list[str], types: list[int], merges: list[str], split: str,
                        source: str) -> tokenizers.Tokenizer:
    """Byte-level BPE over the file's vocabulary; control/user-defined tokens are added tokens."""
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    speller = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    added = {TOKEN_CONTROL, TOKEN_USER_DEFINED}
    vocab: dict[str, int] = {}
    for i, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        key = token
        # A normal token spelled outside the byte alphabet (raw UTF-8) is respelled so BPE can
        # reach it; added tokens keep their text, which is what they match in the input.
        if kind not in added and not set(token) <= alphabet:
            key = "".join(piece for piece, _ in speller.pre_tokenize_str(token))
        if key in vocab:
            raise LoaderError(f"{source}: tokenizer.ggml.tokens lists {token!r} twice "
                              f"(ids {vocab[key]} and {i})")
        vocab[key] = i
    pairs = [tuple(merge.split(" ")) for merge in merges]
    for merge, pair in zip(merges, pairs, strict=True):
        if len(pair) != 2:
            raise LoaderError(f"{source}: tokenizer.ggml.merges entry {merge!r} is not 'a b'")
    try:
        model = models.BPE(vocab=vocab, merges=pairs, ignore_merges=split == "llama3")
    except Exception as exc:
        raise LoaderError(f"{source}: tokenizer.ggml.merges do not fit the tokens: {exc}") from exc
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = _pre_tokenizer(split)
    backend.decoder = decoders.ByteLevel()
    extra = [(i, AddedToken(t, special=kind == TOKEN_CONTROL, normalized=False))
             for i, (t, kind) in enumerate(zip(tokens, types, strict=True)) if kind in added]
    backend.add_special_tokens([tok for _, tok in extra if tok.special])
    backend.add_tokens([tok for _, tok in extra if not tok.special])
    for i, tok in extra:
        if backend.token_to_id(tok.content) != i:
            raise LoaderError(f"{source}: added token {tok.content!r} did not keep its id {i}")
    return backend


def _gguf_field(reader: Any, key: str, source: str) -> Any:
    """The value of GGUF metadata field `key` (a list for arrays), or None when absent."""
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        return field.contents()
    except Exception as exc:  # a damaged or mistyped field
        raise LoaderError(f"{source}: cannot read GGUF field {key}: {exc}") from exc


def _end_of_turn_ids(backend: tokenizers.Tokenizer, template: str | None) -> list[int]:
    found = (backend.token_to_id(m) for m in end_of_turn_markers(template))
    return [i for i in found if i is not None]


def _named_id(backend: tokenizers.Tokenizer, config: Mapping[str, Any], key: str,
              cfg_file: str) -> int | None:
    """The id of the token that tokenizer_config.json names under `key` (str or {"content"})."""
    value = config.get(key)
    value = value.get("content") if isinstance(value, Mapping) else value
    if value is None:
        return None
    token_id = backend.token_to_id(value) if isinstance(value, str) else None
    if token_id is None:
        raise LoaderError(f"{cfg_file}: {key} {value!r} is not a token of tokenizer.json")
    return token_id


def _read_json(file: str) -> dict[str, Any]:
    """The object in `file`, or {} when there is no such file."""
    if not os.path.isfile(file):
        return {}
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise LoaderError(f"{file}: cannot read JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise LoaderError(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data
