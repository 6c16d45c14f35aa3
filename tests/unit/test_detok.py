"""IncrementalDetokenizer: deltas never break a UTF-8 character, never leak the start
of a stop string, and add up to the full decode (cut at the first stop string)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.detok import Delta, IncrementalDetokenizer
from tests.conftest import require, require_default_model

FFFD = "\ufffd"


class ByteTokenizer:
    """Byte-level stand-in: token i is `pieces[i]`; decode joins the bytes (lossy)."""

    def __init__(self, pieces: list[bytes], special: frozenset[int] = frozenset()):
        self.pieces = pieces
        self.special = special

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        kept = [i for i in ids if not (skip_special_tokens and i in self.special)]
        return b"".join(self.pieces[i] for i in kept).decode("utf-8", errors="replace")


class MetaspaceTokenizer:
    """SentencePiece-like stand-in: "▁" is a space, and decode drops the leading one."""

    def __init__(self, pieces: list[str]):
        self.pieces = pieces

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        text = "".join(self.pieces[i] for i in ids).replace("\u2581", " ")
        return text.removeprefix(" ")


def byte_vocab(*pieces: str | bytes) -> tuple[ByteTokenizer, list[int]]:
    raw = [p.encode() if isinstance(p, str) else p for p in pieces]
    return ByteTokenizer(raw), list(range(len(raw)))


def feed(detok: IncrementalDetokenizer, ids: list[int]) -> list[Delta]:
    return [detok.add(i) for i in ids]


def test_emoji_split_over_byte_tokens_comes_out_whole():
    emoji = "😀".encode()
    tok, ids = byte_vocab("Hi ", emoji[:1], emoji[1:2], emoji[2:], "!")
    detok = IncrementalDetokenizer(tok)
    assert [d.text for d in feed(detok, ids)] == ["Hi ", "", "", "😀", "!"]
    assert detok.finish() == "" and detok.text == "Hi 😀!"


def test_text_before_an_unfinished_character_is_not_held():
    cjk = "世".encode()
    tok, ids = byte_vocab(b"ab" + cjk[:2], cjk[2:] + b"c")
    detok = IncrementalDetokenizer(tok)
    assert [d.text for d in feed(detok, ids)] == ["ab", "世c"]


def test_invalid_bytes_are_flushed_by_finish():
    tok, ids = byte_vocab("a", b"\x80", "b", b"\xf0\x9f")
    detok = IncrementalDetokenizer(tok)
    assert [d.text for d in feed(detok, ids)] == ["a", "", FFFD + "b", ""]
    assert detok.finish() == FFFD
    assert detok.text == tok.decode(ids, skip_special_tokens=True)


def test_stop_string_spanning_tokens():
    tok, ids = byte_vocab("Hel", "lo", " wor", "ld", "!")
    detok = IncrementalDetokenizer(tok, stop=["lo wo"])
    deltas = feed(detok, ids[:3])
    assert "".join(d.text for d in deltas) == "Hel"
    assert [d.is_stopped for d in deltas] == [False, False, True]
    assert detok.add(ids[3]) == Delta("", True)  # ignored after the stop
    assert detok.finish() == "" and detok.text == "Hel"


def test_a_possible_stop_is_held_then_released():
    tok, ids = byte_vocab("Hel", "lo", " Help", "er")
    detok = IncrementalDetokenizer(tok, stop=("Help!",))
    assert [d.text for d in feed(detok, ids)] == ["", "Hello", " ", "Helper"]
    assert not detok.is_stopped


def test_finish_flushes_a_held_prefix():
    tok, ids = byte_vocab("So", " Hel")
    detok = IncrementalDetokenizer(tok, stop=["Help"])
    assert [d.text for d in feed(detok, ids)] == ["So", " "]
    assert detok.finish() == "Hel" and detok.text == "So Hel" and not detok.is_stopped


def test_first_stop_to_complete_wins_and_the_rest_of_the_token_is_dropped():
    tok, ids = byte_vocab("ab", "cdSTOPef END")
    detok = IncrementalDetokenizer(tok, stop=["END", "d", "STOP"])
    assert [d.text for d in feed(detok, ids)] == ["ab", "c"]
    assert detok.is_stopped and detok.stop_string == "d"


@pytest.mark.parametrize("split", [["xabcd"], ["xa", "bcd"], ["xab", "cd"], ["x", "a", "b", "c"]])
def test_the_cut_does_not_depend_on_token_boundaries(split):
    # "bc" completes before "abcd" (which starts earlier): the text is cut at "bc".
    tok, ids = byte_vocab(*split)
    detok = IncrementalDetokenizer(tok, stop=["abcd", "bc"])
    text = "".join(d.text for d in feed(detok, ids))
    assert detok.is_stopped and text == "xa" and detok.stop_string == "bc"
    # On a tie of ends, the longer stop (starting first) wins.
    detok = IncrementalDetokenizer(tok, stop=["c", "abc"])
    assert "".join(d.text for d in feed(detok, ids)) == "x" and detok.stop_string == "abc"
    unstopped = IncrementalDetokenizer(tok, stop=["zz"])
    feed(unstopped, ids)
    assert unstopped.stop_string is None


def test_long_stop_strings_cost_per_character_not_per_length(monkeypatch):
    # Stop strings far longer than the HTTP API allows (the detokenizer has no cap of its
    # own). A check that tries every held suffix against the stop strings' prefixes costs
    # the square of the length per token; here each character reaches the stop matcher
    # (KMP automata: amortised O(1) a character) exactly once, however the text was split
    # and however much of it is held back. Counted, not timed.
    from strata.stop_match import StopMatcher

    fed: list[int] = []
    real_feed = StopMatcher.feed
    monkeypatch.setattr(StopMatcher, "feed", lambda self, text: fed.append(len(text)) or real_feed(self, text))
    for size in (2_500, 10_000):
        fed.clear()
        stop = "a" * (size - 1) + "b"
        tok, ids = byte_vocab("a" * (size - 2) + "c", "a" * (size - 1), "b")
        detok = IncrementalDetokenizer(tok, stop=[stop, "zz"])
        assert detok.add(ids[0]).text == "a" * (size - 2) + "c"  # the "c" breaks it: all goes
        assert detok.add(ids[1]).text == ""  # all of it may begin the stop string: held
        assert detok.add(ids[2]) == Delta("", True)  # completed across tokens
        assert detok.text == "a" * (size - 2) + "c"  # cut where it starts
        assert sum(fed) == (size - 1) + (size - 1) + 1  # every character once, none again


def test_near_misses_of_several_long_stop_strings():
    # Near misses of several long stop strings, one character a token, then a release.
    stops = ["a" * 255 + chr(ord("b") + i) for i in range(15)]  # ...b to ...p
    tok, ids = byte_vocab("a", "q")
    detok = IncrementalDetokenizer(tok, stop=stops)
    texts = [d.text for d in feed(detok, [0] * 300 + [1])]
    assert "".join(texts) == "a" * 300 + "q" and not detok.is_stopped
    assert all(len(t) <= 256 for t in texts)


def test_stop_before_an_unfinished_character_is_seen_at_once():
    tok, ids = byte_vocab("xa", b"bc\xf0\x9f", b"\x98\x80")
    detok = IncrementalDetokenizer(tok, stop=["abc"])
    assert feed(detok, ids[:2]) == [Delta("x", False), Delta("", True)]


def test_special_tokens_are_skipped_or_kept():
    pieces = [b"<|im_end|>", b"Hi", b" there"]
    for skip, expected in [(True, "Hi there"), (False, "Hi<|im_end|> there")]:
        detok = IncrementalDetokenizer(
            ByteTokenizer(pieces, frozenset({0})), skip_special_tokens=skip
        )
        text = "".join(d.text for d in feed(detok, [1, 0, 2])) + detok.finish()
        assert text == expected


def test_a_window_decode_that_drops_the_leading_space():
    tok = MetaspaceTokenizer(["\u2581Hello", "\u2581wor", "ld", "\u2581!"])
    detok = IncrementalDetokenizer(tok)
    assert [d.text for d in feed(detok, [0, 1, 2, 3])] == ["Hello", " wor", "ld", " !"]
    assert detok.text == tok.decode([0, 1, 2, 3], skip_special_tokens=True)


def test_misuse_is_an_error():
    tok, ids = byte_vocab("a")
    with pytest.raises(ValueError):
        IncrementalDetokenizer(tok, stop=[""])
    with pytest.raises(TypeError):
        IncrementalDetokenizer(tok, stop="ab")  # type: ignore[arg-type]
    detok = IncrementalDetokenizer(tok)
    detok.finish()
    with pytest.raises(RuntimeError):
        detok.add(ids[0])


# --- the real SmolLM2 vocabulary ---------------------------------------------------

SAMPLE = (
    "Hello, wörld! Ça va? 😀👍🏽 世界你好, こんにちは 🇫🇷 — “quotes” … naïve\n\n"
    "def f(x):\n    return x ** 2  # ok <|im_end|> <|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def smollm2():
    require("transformers")
    require("gguf")
    directory, gguf_file = os.path.split(require_default_model())
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
    backend = hf.backend_tokenizer  # a tokenizers.Tokenizer: decode(ids, skip_special_tokens)
    vocab = backend.get_vocab_size()
    partial = [i for i in range(vocab) if FFFD in backend.decode([i], skip_special_tokens=False)]
    assert len(partial) > 100  # byte pieces of multi-byte characters
    return SimpleNamespace(
        hf=hf,
        tok=backend,
        vocab=vocab,
        partial=partial,
        common=backend.encode(SAMPLE).ids,
        special=sorted(set(hf.all_special_ids) | {0, 1, 2}),
    )


def draw_ids(data, vocab) -> list[int]:
    token = st.one_of(
        st.sampled_from(vocab.partial),
        st.sampled_from(vocab.common),
        st.integers(0, vocab.vocab - 1),
        st.sampled_from(vocab.special),
    )
    return data.draw(st.lists(token, max_size=40), label="ids")


def test_real_tokenizer_sample(smollm2):
    ids = smollm2.common
    for tokenizer in (smollm2.hf, smollm2.tok):
        detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
        deltas = [d.text for d in feed(detok, ids)]
        assert not any(FFFD in d for d in deltas)
        assert "".join(deltas) + detok.finish() == SAMPLE


@settings(max_examples=150, deadline=None)
@given(data=st.data(), skip=st.booleans())
def test_deltas_add_up_to_the_decode(smollm2, data, skip):
    tok = smollm2.tok
    ids = draw_ids(data, smollm2)
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    full = tok.decode(ids, skip_special_tokens=skip)
    emitted = ""
    for t in range(len(ids)):
        delta = detok.add(ids[t])
        assert not delta.is_stopped
        assert FFFD not in delta.text or FFFD in full
        emitted += delta.text
        # Everything stable is out at once; only an unfinished character waits.
        assert emitted == tok.decode(ids[: t + 1], skip_special_tokens=skip).rstrip(FFFD)
    emitted += detok.finish()
    assert emitted == full == detok.text


@settings(max_examples=150, deadline=None)
@given(data=st.data(), skip=st.booleans())
def test_stop_strings_cut_at_the_first_occurrence(smollm2, data, skip):
    tok = smollm2.tok
    ids = draw_ids(data, smollm2)
    full = tok.decode(ids, skip_special_tokens=skip)
    stop_text = st.text(alphabet=sorted(set(full + "ab \n")), min_size=1, max_size=4)
    if full:
        start = st.integers(0, len(full) - 1)
        cut = st.tuples(start, st.integers(1, 6)).map(lambda s: full[s[0] : s[0] + s[1]])
        stop_text = st.one_of(cut, stop_text)
    stops = data.draw(st.lists(stop_text, min_size=1, max_size=3), label="stops")
    # The stop that completes first wins: the smallest end, then the earliest start.
    found = [(i + len(s), i) for s in stops if (i := full.find(s)) >= 0]
    first = min(found)[1] if found else None
    expected = full if first is None else full[:first]
    longest = max(len(s) for s in stops)

    detok = IncrementalDetokenizer(tok, stop=stops, skip_special_tokens=skip)
    emitted = ""
    for t in range(len(ids)):
        delta = detok.add(ids[t])
        emitted += delta.text
        # Never a character of a stop string (or anything after it).
        assert expected.startswith(emitted)
        if delta.is_stopped:
            break
        # Held back: at most a possible stop string start, besides an unfinished char.
        stable = tok.decode(ids[: t + 1], skip_special_tokens=skip).rstrip(FFFD)
        assert len(emitted) >= len(stable) - (longest - 1)
    else:
        emitted += detok.finish()
    assert emitted == expected == detok.text
    assert detok.is_stopped == (first is not None)


# --- a SentencePiece vocabulary (strata/loader/spm.py, built in code) --------------


@pytest.fixture(scope="module")
def spm_tok():
    from strata.loader import gguf_vocab as v
    from strata.loader.spm import sentencepiece_backend
    from strata.loader.tokenizer import Tokenizer

    words = ["\u2581", "\u2581Hello", "\u2581world", "Hello", "!"]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *words]
    types = [v.TOKEN_UNKNOWN, v.TOKEN_CONTROL, v.TOKEN_CONTROL] + [v.TOKEN_BYTE] * 256
    types += [v.TOKEN_NORMAL] * len(words)
    vocab = v.GGUFVocab(
        source="test", model="llama", architecture="llama", tokens=tokens, types=types,
        scores=[0.0] * 259 + [-float(i) for i in range(len(words))], merges=None, pre="default",
        special_ids={"bos": 1, "eos": 2, "unknown": 0}, add_bos=True, add_eos=False,
        add_space_prefix=True, chat_template=None)
    tok = Tokenizer(sentencepiece_backend(vocab), bos_token_id=1, eos_token_ids=[2], add_bos=True)
    named = {w.replace("\u2581", "_"): tokens.index(w) for w in words}  # "_Hello": id of "▁Hello"
    return SimpleNamespace(tok=tok, byte=lambda b: 3 + b, **named)


def test_sentencepiece_output_after_a_prompt_keeps_its_leading_space(spm_tok):
    tok, ids = spm_tok.tok, [spm_tok._Hello, spm_tok._world]
    assert tok.decode(ids) == "Hello world"  # the decoder drops the prefix's space
    detok = IncrementalDetokenizer(tok, context=[1, spm_tok._world])
    assert [d.text for d in feed(detok, ids)] == [" Hello", " world"]
    context_text = tok.decode([1, spm_tok._world], skip_special_tokens=True)
    whole = tok.decode([1, spm_tok._world, *ids], skip_special_tokens=True)
    assert detok.text == whole[len(context_text):]
    alone = IncrementalDetokenizer(tok)
    assert [d.text for d in feed(alone, ids)] == ["Hello", " world"]


def test_a_skipped_special_token_does_not_take_the_next_space(spm_tok):
    ids = [spm_tok._Hello, 2, 1, spm_tok._world, spm_tok._]
    for skip in (True, False):
        detok = IncrementalDetokenizer(spm_tok.tok, skip_special_tokens=skip)
        text = "".join(d.text for d in feed(detok, ids)) + detok.finish()
        assert text == spm_tok.tok.decode(ids, skip_special_tokens=skip)
    assert text == "Hello</s><s> world "


def test_a_byte_run_is_held_until_it_closes(spm_tok):
    tok, b = spm_tok.tok, spm_tok.byte
    valid = [spm_tok._Hello, *(b(x) for x in "世".encode()), spm_tok._world]
    detok = IncrementalDetokenizer(tok)
    assert [d.text for d in feed(detok, valid)] == ["Hello", "", "", "", "世 world"]
    # A run that turns invalid decodes wholly to U+FFFD, the character it completed too:
    # nothing of it was out yet, so the stream still equals the decode.
    broken = [spm_tok._Hello, *(b(x) for x in "世".encode()), b(0xE4), 2, spm_tok._world]
    for skip in (True, False):
        detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
        text = "".join(d.text for d in feed(detok, broken)) + detok.finish()
        assert text == tok.decode(broken, skip_special_tokens=skip)
    assert text == "Hello" + FFFD * 4 + "</s> world"
    unfinished = IncrementalDetokenizer(tok)
    assert "".join(d.text for d in feed(unfinished, broken[:5])) == "Hello"
    assert unfinished.finish() == FFFD * 4


def test_a_context_ending_inside_a_byte_run_is_not_used(spm_tok):
    tok, b = spm_tok.tok, spm_tok.byte
    detok = IncrementalDetokenizer(tok, context=[spm_tok._Hello, b(0xE4)])
    deltas = [d.text for d in feed(detok, [b(0xB8), b(0x96), spm_tok._world])]
    assert deltas == ["", "", FFFD * 2 + " world"]  # decoded as if no prompt came before
