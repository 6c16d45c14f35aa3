"""A Llama-2-style SentencePiece vocabulary (BPE pieces ranked by score, byte fallback, the
space prefix), trained here with the `sentencepiece` library and written with gguf.GGUFWriter.

Checked against two references: transformers' tokenizer built from the same GGUF (the
project's reference: ids, text, every token, the saved directory, the stream), and
sentencepiece itself, which trained the pieces. The two agree except on text that starts
with whitespace: transformers' GGUF tokenizer adds the `▁` prefix only when the text does
not already start with a space (`Metaspace` prepend_scheme "first"), while SentencePiece and
llama.cpp always add it. strata follows transformers; the test pins the difference down.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pytest

from tests.conftest import require
from tests.model.spm_corpus import CORPUS, check_against_reference, check_every_token

spm = require("sentencepiece")
gguf = require("gguf")
transformers = require("transformers")

from strata.detok import IncrementalDetokenizer
from strata.errors import LoaderError
from strata.loader.gguf_file import open_gguf
from strata.loader.tokenizer import Tokenizer

USER_DEFINED = ["<tool>", "\t\t"]
# Llama 2's chat format, in a template of the usual shape.
INST_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
                 "[INST] {{ m['content'] }} [/INST]{% else %} {{ m['content'] }}{{ eos_token }}"
                 "{% endif %}{% endfor %}")
CONTROL = ["<ctrl>"]
LLAMA_TEXTS = {
    "specials": "<s>[INST] hi [/INST] ok</s><unk><ctrl> x",
    "user_defined": "call <tool> now\t\t\tand<tool>",
}
TEXTS = {**CORPUS, **LLAMA_TEXTS}
WORDS = ("the of and to in is was for on that with as by at from his her they this which model "
         "token space code print return value error line file data time year people world hello "
         "quick brown fox jumps over lazy dog café naïve résumé über 日本 語 中文 文本 한국어 текст мир")


def _train(directory: str, add_dummy_prefix: bool = True, byte_fallback: bool = True,
           vocab_size: int = 600) -> Any:
    """A BPE model as Llama 2's was trained: byte fallback, digits split, no normalisation,
    whitespace kept as written (so every character is covered or spelled by its bytes)."""
    rng = random.Random(0)
    words = WORDS.split()
    lines = []
    for _ in range(3000):
        line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 14)))
        if rng.random() < 0.2:
            line = "    " + line
        if rng.random() < 0.2:
            line += "  " + str(rng.randint(0, 99999))
        if rng.random() < 0.1:
            line = "def f(x):\treturn x**2  # " + line
        lines.append(line)
    text_file = os.path.join(directory, "train.txt")
    with open(text_file, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    prefix = os.path.join(directory, "spm")
    spm.SentencePieceTrainer.train(
        input=text_file, model_prefix=prefix, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=byte_fallback, split_digits=True, allow_whitespace_only_pieces=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=add_dummy_prefix, user_defined_symbols=USER_DEFINED,
        control_symbols=CONTROL, character_coverage=0.9995, num_threads=1, minloglevel=2)
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def _token_type(sp: Any, i: int) -> int:
    """The gguf.TokenType llama.cpp's converter gives piece `i`."""
    if sp.IsUnknown(i):
        return gguf.TokenType.UNKNOWN
    if sp.IsControl(i):
        return gguf.TokenType.CONTROL
    if sp.IsByte(i):
        return gguf.TokenType.BYTE
    if sp.IsUnused(i):
        return gguf.TokenType.UNUSED
    return gguf.TokenType.USER_DEFINED if sp.IdToPiece(i) in USER_DEFINED else gguf.TokenType.NORMAL


def write_gguf(path: str, sp: Any, arch: str = "llama", chat_template: str | None = None,
               **flags: bool | None) -> str:
    """`sp`'s vocabulary as llama.cpp writes it; `flags` (add_bos_token, add_eos_token,
    add_space_prefix) are written unless None."""
    n = sp.GetPieceSize()
    writer = gguf.GGUFWriter(path, arch)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([sp.IdToPiece(i) for i in range(n)])
    writer.add_token_scores([sp.GetScore(i) for i in range(n)])
    writer.add_token_types([_token_type(sp, i) for i in range(n)])
    writer.add_bos_token_id(sp.bos_id())
    writer.add_eos_token_id(sp.eos_id())
    writer.add_unk_token_id(sp.unk_id())
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for key, value in flags.items():
        if value is not None:
            writer.add_bool(f"tokenizer.ggml.{key}", value)
    writer.add_tensor("token_embd.weight", np.zeros((n, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _load(path: str) -> tuple[Tokenizer, Any]:
    ours = Tokenizer.from_gguf(open_gguf(path), path)
    ref = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                     gguf_file=os.path.basename(path))
    return ours, ref


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("spm-llama"))


@pytest.fixture(scope="module")
def sp(workdir: str) -> Any:
    return _train(workdir)


@pytest.fixture(scope="module")
def llama(workdir: str, sp: Any) -> tuple[Tokenizer, Any]:
    return _load(write_gguf(os.path.join(workdir, "llama.gguf"), sp, chat_template=INST_TEMPLATE,
                            add_bos_token=True, add_eos_token=False, add_space_prefix=True))


def test_the_vocabulary_is_what_it_should_test(sp: Any, llama: tuple[Tokenizer, Any]) -> None:
    ours, _ = llama
    assert ours.vocab_size == sp.GetPieceSize() == 600
    assert len(ours.byte_piece_ids) == 256 and ours.add_bos and not ours.add_eos
    assert (ours.bos_token_id, ours.eos_token_ids) == (1, (2,))
    assert [ours.is_special(i) for i in range(6)] == [True, True, True, True, False, False]
    # The corpus reaches byte fallback (characters the 600 pieces do not cover).
    assert set(ours.encode(CORPUS["byte_fallback"])) & ours.byte_piece_ids


@pytest.mark.parametrize("name", list(TEXTS))
def test_corpus_matches_transformers(llama: tuple[Tokenizer, Any], name: str) -> None:
    ours, ref = llama
    assert check_against_reference(ours, ref, {name: TEXTS[name]}) == []


def test_every_token_matches_transformers(llama: tuple[Tokenizer, Any]) -> None:
    assert check_every_token(*llama) == []


def test_agrees_with_sentencepiece(sp: Any, llama: tuple[Tokenizer, Any]) -> None:
    ours, _ = llama
    for name, text in CORPUS.items():
        ids = sp.encode(text)
        assert ours.decode(ids) == sp.decode(ids), name
        if "\u2581" in text or "<unk>" in text:  # SentencePiece matches no control token in text
            continue
        if text.startswith(" "):  # the one difference (module docstring): no second `▁`
            if len(text) > 1:  # SentencePiece gives nothing for "", not the prefix alone
                assert ours.encode(text, add_special_tokens=False) == sp.encode(text[1:]), name
        else:
            assert ours.encode(text, add_special_tokens=False) == ids, name
            assert ours.decode(ours.encode(text), skip_special_tokens=True) == text, name


def test_chat_prompt_matches_transformers(llama: tuple[Tokenizer, Any]) -> None:
    ours, ref = llama
    conversation = [
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Hi! 日本語 🎉"},
        {"role": "user", "content": "  two spaces\tand a tab"},
    ]
    text = ours.render_chat(conversation)
    assert text == ref.apply_chat_template(conversation, tokenize=False)
    want = ref.apply_chat_template(conversation, tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert ours.encode_chat(conversation) == list(want)
    assert ours.encode_chat(conversation)[:1] == [1] and text.count("<s>") == 1


def test_saved_dir_round_trips(llama: tuple[Tokenizer, Any], tmp_path: Any) -> None:
    ours, _ = llama
    ours.save_hf(str(tmp_path))
    again = Tokenizer.from_hf_dir(str(tmp_path))
    fast = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    assert again.byte_piece_ids == ours.byte_piece_ids and again.add_bos
    assert again.chat_template == ours.chat_template == INST_TEMPLATE
    conversation = [{"role": "user", "content": "hi"}]
    assert again.encode_chat(conversation) == ours.encode_chat(conversation)
    for text in TEXTS.values():
        ids = ours.encode(text)
        assert again.encode(text) == ids == fast.encode(text), text
        assert again.decode(ids) == ours.decode(ids) == fast.decode(ids), text


@pytest.mark.parametrize("skip", [False, True])
def test_stream_keeps_the_leading_space_after_a_prompt(llama: tuple[Tokenizer, Any],
                                                       skip: bool) -> None:
    """The decoder drops one leading space (the prefix): after a prompt, the output's first
    `▁` is a real space. Streamed with the prompt as context, the output is the prompt's
    continuation; without one, it is the decode of the output alone."""
    ours, ref = llama
    prompt = ours.encode("The capital of France is")
    for name, text in TEXTS.items():
        out = ours.encode(" " + text, add_special_tokens=False)
        detok = IncrementalDetokenizer(ours, skip_special_tokens=skip, context=prompt)
        streamed = "".join(detok.add(i).text for i in out) + detok.finish()
        whole = ref.decode(prompt + out, skip_special_tokens=skip)
        assert streamed == whole[len(ref.decode(prompt, skip_special_tokens=skip)):], name
        alone = IncrementalDetokenizer(ours, skip_special_tokens=skip)
        streamed = "".join(alone.add(i).text for i in out) + alone.finish()
        assert streamed == ref.decode(out, skip_special_tokens=skip), name


def test_flags_phi3_and_defaults_match_transformers(workdir: str, sp: Any) -> None:
    """add_eos_token (EOS appended), no add_bos_token (BOS by default), and Phi-3's prefix
    before every stretch of text between added tokens."""
    cases = {
        "eos.gguf": dict(add_bos_token=False, add_eos_token=True),
        "defaults.gguf": dict(),
        "phi3.gguf": dict(arch="phi3"),
    }
    built = {}
    for name, flags in cases.items():
        ours, ref = _load(write_gguf(os.path.join(workdir, name), sp, **flags))
        assert check_against_reference(ours, ref, TEXTS) == [], name
        built[name] = ours
    eos, defaults, phi3 = built.values()
    assert eos.encode("hi") == [*eos.encode("hi", add_special_tokens=False), 2]
    assert defaults.encode("hi")[0] == 1 and defaults.decode(defaults.encode(" hi")) == "<s> hi"
    # After an added token: the prefix again (Phi-3) or not (Llama, prepend_scheme "first").
    assert phi3.encode("<ctrl>hi", add_special_tokens=False)[1:] == phi3.encode("hi")[1:]
    assert defaults.encode("<ctrl>hi", add_special_tokens=False)[1:] != defaults.encode("hi")[1:]


def test_no_space_prefix_matches_sentencepiece(workdir: str) -> None:
    """`add_space_prefix = false`: no `▁` before the text, as SentencePiece trained without
    one encodes (transformers' GGUF tokenizer ignores the flag, so SentencePiece is the
    reference here), and decoding keeps a leading space."""
    os.makedirs(os.path.join(workdir, "noprefix"))
    sp = _train(os.path.join(workdir, "noprefix"), add_dummy_prefix=False)
    path = write_gguf(os.path.join(workdir, "noprefix.gguf"), sp, add_space_prefix=False)
    ours = Tokenizer.from_gguf(open_gguf(path), path)
    for name, text in CORPUS.items():
        if "\u2581" in text or "<unk>" in text:
            continue
        ids = sp.encode(text)
        assert ours.encode(text, add_special_tokens=False) == ids, name
        assert ours.decode(ids) == sp.decode(ids) == text, name


def test_without_byte_pieces_unknown_characters_are_the_unknown_token(workdir: str) -> None:
    """No `<0xNN>` pieces: a character no piece covers is the unknown token, one for a run,
    as SentencePiece encodes (transformers' GGUF tokenizer drops such characters instead)."""
    os.makedirs(os.path.join(workdir, "nobytes"))
    sp = _train(os.path.join(workdir, "nobytes"), byte_fallback=False, vocab_size=300)
    path = write_gguf(os.path.join(workdir, "nobytes.gguf"), sp)
    ours = Tokenizer.from_gguf(open_gguf(path), path)
    assert not ours.byte_piece_ids
    for name, text in CORPUS.items():
        if "\u2581" in text or "<unk>" in text or text.startswith(" "):
            continue
        assert ours.encode(text, add_special_tokens=False) == sp.encode(text), name
    assert sp.unk_id() in ours.encode(CORPUS["byte_fallback"])


def test_bad_sentencepiece_metadata_is_a_loader_error(workdir: str, sp: Any) -> None:
    path = write_gguf(os.path.join(workdir, "bad.gguf"), sp)
    reader = open_gguf(path)
    del reader.fields["tokenizer.ggml.scores"]
    with pytest.raises(LoaderError, match=r"bad\.gguf: GGUF field tokenizer\.ggml\.scores"):
        Tokenizer.from_gguf(reader, path)
