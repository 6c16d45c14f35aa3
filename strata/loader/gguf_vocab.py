"""The vocabulary a GGUF file's `tokenizer.*` metadata describes, read and checked once.

`read_gguf_vocab` reads the fields both backends need (byte-level BPE in `byte_level.py`,
SentencePiece in `spm.py`) and refuses, naming the field, what neither can build.

Invariants of a `GGUFVocab`: `tokens` is non-empty; `types` and (when present) `scores`
have one entry per token; every special id is inside the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata.errors import LoaderError

# llama.cpp's token types (gguf.TokenType).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL = 1, 2, 3
TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 4, 5, 6

# `tokenizer.ggml.model` -> what strata builds for it.
TOKENIZER_MODELS = {"gpt2": "byte-level BPE", "llama": "SentencePiece"}
SPECIAL_IDS = ("bos", "eos", "eot", "eom", "unknown", "padding")


@dataclass(frozen=True)
class GGUFVocab:
    source: str  # the file, for messages
    model: str  # tokenizer.ggml.model: a key of TOKENIZER_MODELS
    architecture: str | None  # general.architecture (SentencePiece merge order depends on it)
    tokens: list[str]
    types: list[int]  # TOKEN_* per token (all TOKEN_NORMAL when the file has none)
    scores: list[float] | None
    merges: list[str] | None  # "left right" per merge (byte-level BPE files)
    pre: str  # tokenizer.ggml.pre, "default" when absent
    special_ids: dict[str, int | None]  # SPECIAL_IDS -> tokenizer.ggml.<name>_token_id
    add_bos: bool | None  # tokenizer.ggml.add_bos_token (None: the file does not say)
    add_eos: bool | None  # tokenizer.ggml.add_eos_token
    add_space_prefix: bool | None  # tokenizer.ggml.add_space_prefix
    chat_template: str | None


def gguf_field(reader: Any, key: str, source: str) -> Any:
    """The value of GGUF metadata field `key` (a list for arrays), or None when absent."""
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        return field.contents()
    except Exception as exc:  # a damaged or mistyped field
        raise LoaderError(f"{source}: cannot read GGUF field {key}: {exc}") from exc


def read_gguf_vocab(reader: Any, source: str) -> GGUFVocab:
    """The `tokenizer.*` metadata of a `gguf.GGUFReader`; LoaderError naming a bad field."""
    def field(key: str) -> Any:
        return gguf_field(reader, key, source)

    model = field("tokenizer.ggml.model")
    if model not in TOKENIZER_MODELS:
        known = ", ".join(f"{k!r} ({v})" for k, v in TOKENIZER_MODELS.items())
        raise LoaderError(f"{source}: tokenizer.ggml.model {model!r} is not supported; "
                          f"strata builds {known}")
    tokens = field("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise LoaderError(f"{source}: GGUF field tokenizer.ggml.tokens is missing or empty")
    types = field("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    scores = field("tokenizer.ggml.scores")
    for key, values in (("token_type", types), ("scores", scores)):
        if values is not None and len(values) != len(tokens):
            raise LoaderError(f"{source}: tokenizer.ggml.{key} has {len(values)} entries, "
                              f"tokenizer.ggml.tokens has {len(tokens)}")
    special_ids = {k: field(f"tokenizer.ggml.{k}_token_id") for k in SPECIAL_IDS}
    for k, v in special_ids.items():
        if v is not None and not (isinstance(v, int) and 0 <= v < len(tokens)):
            raise LoaderError(f"{source}: tokenizer.ggml.{k}_token_id {v!r} is not an id "
                              f"in the {len(tokens)}-token vocabulary")
    flags = {k: field(f"tokenizer.ggml.{k}") for k in ("add_bos_token", "add_eos_token",
                                                        "add_space_prefix")}
    for key, value in flags.items():
        if value is not None and not isinstance(value, bool):
            raise LoaderError(f"{source}: tokenizer.ggml.{key} is {value!r}, not a bool")
    return GGUFVocab(
        source=source, model=model, architecture=field("general.architecture"),
        tokens=tokens, types=list(types), scores=scores,
        merges=field("tokenizer.ggml.merges"), pre=field("tokenizer.ggml.pre") or "default",
        special_ids=special_ids, add_bos=flags["add_bos_token"],
        add_eos=flags["add_eos_token"], add_space_prefix=flags["add_space_prefix"],
        chat_template=field("tokenizer.chat_template"))
