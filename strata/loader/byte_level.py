"""Byte-level BPE vocabularies from GGUF (`tokenizer.ggml.model == "gpt2"`) as a tokenizers BPE.

The file gives tokens (in GPT-2's byte alphabet), merges and `tokenizer.ggml.pre`, which names
how text is split before BPE (as in llama.cpp); a split not known here is refused.
Control and user-defined tokens become added tokens (special and plain), matched whole.
"""

from __future__ import annotations

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from strata.errors import LoaderError
from strata.loader.gguf_vocab import TOKEN_CONTROL, TOKEN_USER_DEFINED, GGUFVocab

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# `tokenizer.ggml.pre` -> how text is split before BPE, as in llama.cpp; a name not here is refused.
PRE_SPLITS = {
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


def byte_level_backend(vocab: GGUFVocab) -> tokenizers.Tokenizer:
    """Byte-level BPE over the file's vocabulary; control/user-defined tokens are added tokens."""
    source, tokens, types, merges = vocab.source, vocab.tokens, vocab.types, vocab.merges
    if not isinstance(merges, list) or not merges:
        raise LoaderError(f"{source}: GGUF field tokenizer.ggml.merges is missing or empty")
    if vocab.pre not in PRE_SPLITS:
        raise LoaderError(f"{source}: tokenizer.ggml.pre {vocab.pre!r} is not supported; "
                          f"known: {', '.join(sorted(PRE_SPLITS))}")
    split = PRE_SPLITS[vocab.pre]
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    speller = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    added = {TOKEN_CONTROL, TOKEN_USER_DEFINED}
    ids: dict[str, int] = {}
    for i, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        key = token
        # A normal token spelled outside the byte alphabet (raw UTF-8) is respelled so BPE can
        # reach it; added tokens keep their text, which is what they match in the input.
        if kind not in added and not set(token) <= alphabet:
            key = "".join(piece for piece, _ in speller.pre_tokenize_str(token))
        if key in ids:
            raise LoaderError(f"{source}: tokenizer.ggml.tokens lists {token!r} twice "
                              f"(ids {ids[key]} and {i})")
        ids[key] = i
    pairs = [tuple(merge.split(" ")) for merge in merges]
    for merge, pair in zip(merges, pairs, strict=True):
        if len(pair) != 2:
            raise LoaderError(f"{source}: tokenizer.ggml.merges entry {merge!r} is not 'a b'")
    try:
        model = models.BPE(vocab=ids, merges=pairs, ignore_merges=split == "llama3")
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
