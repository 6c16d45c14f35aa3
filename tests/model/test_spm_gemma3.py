"""The SentencePiece tokenizer of the real Gemma 3 270M file (262,144 pieces), against transformers.

transformers builds its own tokenizer from the same GGUF (`AutoTokenizer.from_pretrained(dir,
gguf_file=name)`, about two minutes here); strata's must give the same ids and the same text
on the corpus (tests/model/spm_corpus.py) and for every token of the vocabulary, and stream
the same text. Only the tokenizer: `Tokenizer.from_gguf` reads the file's metadata.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import require, require_gemma3_file
from tests.model.spm_corpus import CORPUS, check_against_reference, check_every_token

GGUF_PATH = require_gemma3_file()
MODEL_DIR, GGUF_NAME = os.path.split(GGUF_PATH)
transformers = require("transformers")
require("gguf")

from strata.detok import IncrementalDetokenizer
from strata.loader.gguf_file import open_gguf
from strata.loader.tokenizer import Tokenizer

FFFD = "\ufffd"
GEMMA_TEXTS = {
    "turns": "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "specials_inline": "text<end_of_turn>more<bos>x<pad>y<eos>",
    "specials_broken": "<start_of_turn user <end_of_turn <bo s>",
    "user_defined": "<table><tr><td>cell</td></tr></table> <start_of_image> [multimodal]",
    "html_like": "<s>not a bos</s> <b>bold</b> <code>x</code>",
    "tab_runs": "\t\t\t\tdeep" + "\t" * 35 + "end",
    "newline_runs": "a" + "\n" * 35 + "b",
}
TEXTS = {**CORPUS, **GEMMA_TEXTS}


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    return Tokenizer.from_gguf(open_gguf(GGUF_PATH), GGUF_PATH)


@pytest.fixture(scope="module")
def ref() -> Any:
    return transformers.AutoTokenizer.from_pretrained(MODEL_DIR, gguf_file=GGUF_NAME)


def test_metadata_matches(ours: Tokenizer, ref: Any) -> None:
    assert ours.vocab_size == len(ref) == 262144
    assert (ours.bos_token_id, ours.eos_token_ids) == (2, (1,))
    assert (ref.bos_token_id, ref.eos_token_id) == (2, 1)
    assert ours.add_bos and not ours.add_eos and ours.chat_template is None  # a base model
    assert [ours.is_special(i) for i in (0, 1, 2, 3, 105, 106)] == [True] * 6
    assert not any(ours.is_special(i) for i in (5, 107, 138, 168, 255968, 255999))  # user-defined
    assert ours.byte_piece_ids == frozenset(range(238, 238 + 256))
    assert ours.id_to_token(238 + 0x41) == "<0x41>" and ours.token_to_id("▁the") is not None


@pytest.mark.parametrize("name", list(TEXTS))
def test_corpus_matches_transformers(ours: Tokenizer, ref: Any, name: str) -> None:
    assert check_against_reference(ours, ref, {name: TEXTS[name]}) == []
    text = TEXTS[name]
    if "\u2581" not in text:  # a `▁` written in the text is a space to SentencePiece
        assert ours.decode(ours.encode(text, add_special_tokens=False)) == text


def test_every_token_matches_transformers(ours: Tokenizer, ref: Any) -> None:
    assert check_every_token(ours, ref)[:20] == []


def test_pieces_spaces_and_bytes(ours: Tokenizer) -> None:
    piece = ours.token_to_id
    hello = [piece("Hello"), piece("▁world")]
    assert ours.encode("Hello world", add_special_tokens=False) == hello
    assert ours.encode("  x", add_special_tokens=False)[0] == 138  # the file's "  " piece
    assert ours.encode("<end_of_turn>") == [2, 106]
    rare = "\U0010fffd"  # no piece: its four UTF-8 bytes
    assert ours.encode(rare, add_special_tokens=False) == [238 + b for b in rare.encode()]
    assert ours.decode([238 + b for b in rare.encode()]) == rare
    assert ours.decode([238 + 0xF4]) == FFFD  # a lone lead byte


def test_saved_dir_round_trips(ours: Tokenizer, tmp_path: Any) -> None:
    ours.save_hf(str(tmp_path))
    again = Tokenizer.from_hf_dir(str(tmp_path))
    fast = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    assert (again.bos_token_id, again.eos_token_ids) == (2, (1,))
    assert again.add_bos and not again.add_eos
    assert again.byte_piece_ids == ours.byte_piece_ids
    for text in TEXTS.values():
        ids = ours.encode(text)
        assert again.encode(text) == ids == fast.encode(text), text
        assert again.decode(ids) == ours.decode(ids) == fast.decode(ids), text


def _stream(tok: Tokenizer, ids: list[int], skip: bool, context: list[int] = ()) -> list[str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip, context=context)
    deltas = [detok.add(i).text for i in ids]
    return deltas + [detok.finish()]


@pytest.mark.parametrize("skip", [False, True])
def test_streamed_text_equals_the_decode(ours: Tokenizer, ref: Any, skip: bool) -> None:
    for name, text in TEXTS.items():
        ids = ours.encode(text)
        deltas = _stream(ours, ids, skip)
        assert "".join(deltas) == ref.decode(ids, skip_special_tokens=skip), name
        assert not any(d.endswith(FFFD) for d in deltas) or FFFD in text, name
        # Streamed after a prompt: the continuation of the prompt's text.
        prompt = ours.encode("Prompt: ")
        whole = ref.decode(prompt + ids, skip_special_tokens=skip)
        prefix = ref.decode(prompt, skip_special_tokens=skip)
        assert "".join(_stream(ours, ids, skip, prompt)) == whole[len(prefix):], name


@pytest.fixture(scope="module")
def pools(ours: Tokenizer) -> dict[str, list[int]]:
    common = sorted({i for text in TEXTS.values() for i in ours.encode(text)})
    special = [0, 1, 2, 3, 105, 106]
    return {"bytes": sorted(ours.byte_piece_ids), "common": common, "special": special}


@settings(max_examples=150, deadline=None)
@given(data=st.data(), skip=st.booleans())
def test_random_ids_stream_exactly(ours: Tokenizer, pools: dict[str, list[int]], data: Any,
                                   skip: bool) -> None:
    """Any ids (runs of byte pieces, valid or not, specials between them): deltas never take
    back text, hold only an open byte run or an unfinished character, and add up to the decode."""
    token = st.one_of(*(st.sampled_from(p) for p in pools.values()),
                      st.integers(0, ours.vocab_size - 1))
    ids = data.draw(st.lists(token, max_size=40), label="ids")
    full = ours.decode(ids, skip_special_tokens=skip)
    detok = IncrementalDetokenizer(ours, skip_special_tokens=skip)
    emitted = ""
    for t in range(len(ids)):
        emitted += detok.add(ids[t]).text
        assert full.startswith(emitted)
        open_run = t + 1
        while open_run > 0 and (ids[open_run - 1] in ours.byte_piece_ids
                                or (skip and ours.is_special(ids[open_run - 1]))):
            open_run -= 1
        if not any(i in ours.byte_piece_ids for i in ids[open_run:t + 1]):
            open_run = t + 1  # only skipped specials at the end: nothing is open
        assert emitted == ours.decode(ids[:open_run], skip_special_tokens=skip).rstrip(FFFD)
    assert emitted + detok.finish() == full == detok.text
