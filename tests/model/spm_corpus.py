"""The texts every SentencePiece vocabulary is checked on, and the checks against a reference.

The corpus covers what SentencePiece handles specially: spaces (`▁`, the space prefix) in
runs, at the start and at the end, next to tabs and newlines; scripts of every width in UTF-8;
emoji sequences joined by ZWJ and modifiers; code; characters no piece covers (byte fallback:
controls, private use, rare planes, unassigned code points); the spellings SentencePiece uses
for itself (`▁`, `<0x41>`) written as text; and special-token spellings, whole and broken.
"""

from __future__ import annotations

from typing import Any

CORPUS = {
    "ascii": "Hello world! The quick brown fox jumps over the lazy dog.",
    "leading_spaces": "   three leading spaces",
    "leading_space": " one leading space",
    "trailing_spaces": "trailing spaces   ",
    "space_runs": "a  b   c    d     e" + " " * 40 + "f",
    "only_spaces": "     ",
    "one_space": " ",
    "tabs": "\tindented\t\ttwice\t \t mixed \t",
    "newlines": "line one\n\n\nline two\r\nline three\n",
    "leading_newline": "\n starts with a newline",
    "spaces_around_newlines": "end of line   \n   start of line\n \n",
    "other_spaces": "nbsp\u00a0thin\u2009ideographic\u3000zero\u200bwidth",
    "accents": "Café naïve résumé — “quotes” über façade Ångström",
    "combining": "e\u0301 a\u0300 n\u0303 Z\u0351\u0352\u0353",
    "cjk": "日本語のテキスト、中文文本。한국어 텍스트",
    "rtl": "مرحبا بالعالم — שלום עולם — سلام دنیا",
    "indic_thai": "हिन्दी भाषा তামিল ภาษาไทย ဗမာ",
    "greek_cyrillic": "Ελληνικά и кириллица, Ѣ ѣ",
    "emoji": "emoji 🎉👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷 keycap 1️⃣ heart ❤️‍🔥",
    "emoji_run": "🧑🏿‍🚀🧑🏻‍🔬🏳️‍🌈🏴‍☠️🫠🫨",
    "code_python": "def f(x):\n    return x**2  # comment\n\nprint(f(3) != {'a': [1, 2]})\n",
    "code_c": "int main(void) {\n\tfor (int i = 0; i < 10; ++i) printf(\"%d\\n\", i);\n\treturn 0;\n}",
    "code_json": '{"key": [1, 2.5, null, true], "nested": {"s": "a\\u00e9"}}',
    "digits": "Numbers 1234567 and 3.14159, 2024-01-01, 1,000,000",
    "byte_fallback": "controls \x00\x01\x07\x1b\x7f private \ue000\U000f0000 rare 𐀀𒀀𓀀 \U0010fffd",
    "unassigned": "\U0003fffd\U000e0041\U000e007f\u0378",
    "sentencepiece_spellings": "a\u2581b \u2581\u2581 <0x41> <0xFF> <0x4> <unk>",
    "long_word": "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3,
    "mixed": "Mix: 日本 + émoji 🚀\ttab\n  code `x = 1`  ",
    "empty": "",
}


def check_against_reference(ours: Any, ref: Any, texts: dict[str, str]) -> list[str]:
    """Differences between strata's Tokenizer and transformers' on each text (empty: none)."""
    errors = []
    for name, text in texts.items():
        for special in (True, False):
            got, want = ours.encode(text, add_special_tokens=special), ref.encode(
                text, add_special_tokens=special)
            if got != want:
                errors.append(f"{name} (add_special_tokens={special}): encode {got} != {want}")
        ids = ref.encode(text)
        for skip in (False, True):
            got, want = ours.decode(ids, skip_special_tokens=skip), ref.decode(
                ids, skip_special_tokens=skip)
            if got != want:
                errors.append(f"{name} (skip_special_tokens={skip}): decode {got!r} != {want!r}")
    return errors


def check_every_token(ours: Any, ref: Any) -> list[str]:
    """Every id decodes as the reference decodes it, and every piece's text encodes (without
    special tokens) to the reference's ids: the whole vocabulary, not only the corpus."""
    ids = list(range(ours.vocab_size))
    texts = [ours.decode([i]) for i in ids]
    errors = [f"decode([{i}]) {t!r} != {r!r}"
              for i, t, r in zip(ids, texts, ref.batch_decode([[i] for i in ids]))
              if t != r]
    want = ref(texts, add_special_tokens=False)["input_ids"]
    for text, w in zip(texts, want):
        if (g := ours.encode(text, add_special_tokens=False)) != w:
            errors.append(f"encode({text!r}) {g} != {w}")
    return errors
