"""The model's tokenizer: a HF `tokenizers.Tokenizer` plus BOS/EOS ids and the chat template.

Built from a GGUF file's `tokenizer.*` metadata (byte-level BPE, `tokenizer.ggml.model == "gpt2"`,
in byte_level.py; SentencePiece, "llama", in spm.py) or from a Hugging Face directory
(`tokenizer.json` + `tokenizer_config.json`).

Invariants:
- `encode` runs the backend without its post-processor; BOS and EOS are added here, and only when
  `add_bos` / `add_eos` is set (EOS only where the file asks for it, as llama.cpp and
  transformers do), so those two flags alone decide what encode adds.
- Special tokens (GGUF control tokens, HF added tokens with `special=True`) and GGUF user-defined
  tokens are matched whole wherever they appear in text, as HF added tokens are.
- Every id held here (`bos_token_id`, `eos_token_ids`) is inside the vocabulary.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import tokenizers
from tokenizers import processors

from strata.errors import LoaderError
from strata.loader.byte_level import byte_level_backend
from strata.loader.chat import ChatTemplate, end_of_turn_markers, no_template_error, pick_template
from strata.loader.gguf_vocab import read_gguf_vocab
from strata.loader.spm import sentencepiece_backend

_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


class Tokenizer:
    """Text <-> token ids for one model, and its chat prompt."""

    # Also the values of instances pickled (prepared.py) before these attributes existed.
    add_eos: bool = False
    byte_piece_ids: frozenset[int] = frozenset()  # `<0xNN>` pieces a byte-fallback decoder reads

    def __init__(self, backend: tokenizers.Tokenizer, *, bos_token_id: int | None = None,
                 eos_token_ids: Iterable[int] = (), add_bos: bool = False, add_eos: bool = False,
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
        if add_eos and not eos_token_ids:
            raise LoaderError(f"{source}: the tokenizer asks for EOS but names no EOS token")
        self.bos_token_id: int | None = bos_token_id
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_token_ids))
        self.add_bos: bool = bool(add_bos)
        self.add_eos = bool(add_eos)
        self._special_ids = frozenset(
            i for i, tok in backend.get_added_tokens_decoder().items() if tok.special)
        if getattr(backend.model, "byte_fallback", False):  # a BPE that spells bytes as pieces
            self.byte_piece_ids = frozenset(
                i for piece, i in backend.get_vocab(with_added_tokens=False).items()
                if _BYTE_PIECE.fullmatch(piece))
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
        if add_special_tokens and self.add_eos:
            ids.append(self.eos_token_ids[0])  # checked in __init__
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
        vocab = read_gguf_vocab(reader, source)
        if vocab.model == "gpt2":
            backend = byte_level_backend(vocab)
        else:
            backend = sentencepiece_backend(vocab)
        ids, template = vocab.special_ids, vocab.chat_template
        eos_ids = [ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None]
        # A SentencePiece file that does not say adds BOS (llama.cpp's and transformers' rule).
        add_bos = vocab.add_bos if vocab.add_bos is not None else vocab.model == "llama"
        return cls(backend, bos_token_id=ids["bos"],
                   eos_token_ids=eos_ids + _end_of_turn_ids(backend, template),
                   add_bos=add_bos, add_eos=bool(vocab.add_eos),
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
        add_bos, add_eos = config.get("add_bos_token"), config.get("add_eos_token") is True
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
                   add_eos=add_eos, chat_template=template, source=path)

    def save_hf(self, path: str) -> None:
        """Write `tokenizer.json` and `tokenizer_config.json` so `from_hf_dir` (or transformers)
        gives back the same ids, BOS/EOS rule and chat template. transformers takes the BOS/EOS
        rule from tokenizer.json's post-processor, written here from `add_bos`/`add_eos` (on a
        copy: this tokenizer encodes without one)."""
        os.makedirs(path, exist_ok=True)
        bos = None if self.bos_token_id is None else self.id_to_token(self.bos_token_id)
        eos = self.id_to_token(self.eos_token_ids[0]) if self.eos_token_ids else None
        ends = [(bos, self.bos_token_id)] if self.add_bos else []
        ends += [(eos, self.eos_token_ids[0])] if self.add_eos else []
        single = [f"{bos}:0"] * self.add_bos + ["$A:0"] + [f"{eos}:0"] * self.add_eos
        pair = single + [f"{bos}:1"] * self.add_bos + ["$B:1"] + [f"{eos}:1"] * self.add_eos
        backend = tokenizers.Tokenizer.from_str(self.backend.to_str())
        backend.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=list(dict.fromkeys(ends)))
        backend.save(os.path.join(path, "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": bos, "eos_token": eos,
            "add_bos_token": self.add_bos, "add_eos_token": self.add_eos,
            "clean_up_tokenization_spaces": False,
            "chat_template": self.chat_template,
        }
        with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=2)


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
