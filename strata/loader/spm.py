"""SentencePiece vocabularies from GGUF (`tokenizer.ggml.model == "llama"`) as a tokenizers BPE.

A GGUF file keeps a SentencePiece model as its pieces, scores and token types, without merges.
The backend is a `tokenizers` BPE with byte fallback whose merges are recovered from the pieces:
every way to cut a piece into two pieces of the vocabulary is a merge, and merges rank by the
piece they make. SentencePiece's BPE joins, of all adjacent pairs, the one whose joined piece
has the best score; a BPE whose merges rank by that score joins the same pairs. Gemma files list
their pieces in merge order while their scores do not follow it (control and user-defined
pieces score -1000 wherever they sit), so for them the file order is the rank. Ties rank the
longer left part first, then the longer right part, then file order. This is how transformers
builds the tokenizer of the same file, the reference the tests compare with.

Text to pieces: each space becomes `▁`; with `add_space_prefix` (llama.cpp's flag: true unless
the file says otherwise, false for Gemma) one `▁` goes before the text (transformers'
`Metaspace` prepend_scheme "first"; Phi-3 files put it before every stretch between added
tokens) and decoding drops one leading space again. A character no piece covers is spelled by
its UTF-8 bytes, `<0xNN>` pieces (byte fallback), which decode back to those bytes; without a
byte piece it becomes the unknown token. Control and unknown tokens are special added tokens,
user-defined ones plain added tokens; both are matched whole wherever they appear in text.
"""

from __future__ import annotations

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers

from strata.errors import LoaderError
from strata.loader.gguf_vocab import TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED, GGUFVocab

SPACE = "\u2581"  # SentencePiece's space
# Architectures whose files list pieces in merge order (their scores do not follow it).
FILE_ORDER_ARCHES = frozenset({"gemma", "gemma2", "gemma3"})
# Architectures whose space prefix goes before every stretch of text between added tokens.
PREFIX_EVERY_STRETCH_ARCHES = frozenset({"phi3"})


def sentencepiece_backend(vocab: GGUFVocab) -> tokenizers.Tokenizer:
    """The file's SentencePiece vocabulary as a byte-fallback BPE (see the module docstring)."""
    source = vocab.source
    file_order = vocab.architecture in FILE_ORDER_ARCHES
    # Gemma stores its pieces of 2+ spaces as spaces; as pieces they are spelled with `▁`.
    pieces = [SPACE * len(t) if file_order and len(t) > 1 and not t.strip(" ") else t
              for t in vocab.tokens]
    index: dict[str, int] = {}
    for i, piece in enumerate(pieces):
        if piece in index:
            raise LoaderError(f"{source}: tokenizer.ggml.tokens lists {vocab.tokens[i]!r} twice "
                              f"(ids {index[piece]} and {i})")
        index[piece] = i
    if file_order:
        rank = [float(i) for i in range(len(pieces))]
    elif vocab.scores is None:
        raise LoaderError(f"{source}: GGUF field tokenizer.ggml.scores is missing (a SentencePiece "
                          "vocabulary ranks its merges by the pieces' scores)")
    else:
        rank = [-float(s) for s in vocab.scores]
    unk_id = vocab.special_ids["unknown"]
    unk = pieces[unk_id] if unk_id is not None else ("<unk>" if "<unk>" in index else None)
    try:
        model = models.BPE(vocab=index, merges=derive_merges(pieces, rank, index), unk_token=unk,
                           fuse_unk=True, byte_fallback=True)
    except Exception as exc:
        raise LoaderError(f"{source}: cannot build the SentencePiece vocabulary: {exc}") from exc
    backend = tokenizers.Tokenizer(model)
    prefix = vocab.add_space_prefix
    if prefix is None:
        prefix = not file_order
    if prefix and vocab.architecture in PREFIX_EVERY_STRETCH_ARCHES:
        backend.normalizer = normalizers.Sequence(
            [normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SPACE, prepend_scheme="first" if prefix else "never", split=False)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(
        steps + ([decoders.Strip(content=" ", left=1, right=0)] if prefix else []))
    _add_tokens(backend, vocab, pieces)
    return backend


def derive_merges(pieces: list[str], rank: list[float],
                  index: dict[str, int]) -> list[tuple[str, str]]:
    """Every (left, right) with left + right a piece and both parts pieces, best first: by the
    joined piece's `rank` (lower is better), then the longer left part, then the longer right
    part, then file order."""
    found = []
    for i, piece in enumerate(pieces):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in index and right in index:
                found.append((rank[i], -cut, cut - len(piece), i, left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def _add_tokens(backend: tokenizers.Tokenizer, vocab: GGUFVocab, pieces: list[str]) -> None:
    """Control and unknown tokens as special added tokens, user-defined ones as plain added
    tokens (a user-defined run of spaces stays a piece: it is reached through `▁` merges)."""
    special = {TOKEN_CONTROL, TOKEN_UNKNOWN}
    rows = enumerate(zip(vocab.tokens, vocab.types, pieces, strict=True))
    extra = [(i, AddedToken(t, special=kind in special, normalized=False))
             for i, (t, kind, piece) in rows
             if kind in special or (kind == TOKEN_USER_DEFINED and piece == t)]
    backend.add_special_tokens([tok for _, tok in extra if tok.special])
    backend.add_tokens([tok for _, tok in extra if not tok.special])
    for i, tok in extra:
        if backend.token_to_id(tok.content) != i:
            raise LoaderError(
                f"{vocab.source}: added token {tok.content!r} did not keep its id {i}")
