"""The grammar libraries on the default model's vocabulary: compile time of a JSON schema
(a fresh schema each trial, so no cache answers) and the per-token mask cost while a fixed
valid answer is walked token by token. llguidance is strata's; xgrammar and outlines-core
are measured when they are importable (e.g. `--libs-path DIR` holding them)."""

from __future__ import annotations

import json
import statistics
import time

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
    "kind": {"enum": ["cat", "dog", "bird"]},
    "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False}},
    "required": ["name", "age", "tags", "kind", "address"], "additionalProperties": False}
ANSWER = {"name": "Ada Lovelace", "age": 36, "tags": ["math", "engines", "poetry"], "kind": "cat",
          "address": {"city": "London", "zip": "12345"}}


def _schema(trial: int) -> dict:
    return {**SCHEMA, "title": f"trial{trial}"}


def measure_llguidance(tokenizer, vocab: int, eos: int, trials: int) -> dict:
    import llguidance
    import llguidance.torch as lt

    t0 = time.perf_counter()
    lltok = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab, eos_token=eos)
    setup = time.perf_counter() - t0
    ids = tokenizer.encode(json.dumps(ANSWER), add_special_tokens=False)
    compiles, masks = [], []
    mask = lt.allocate_token_bitmask(1, vocab)
    for trial in range(trials + 1):
        t0 = time.perf_counter()
        m = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(_schema(trial)))
        lt.fill_next_token_bitmask(m, mask)  # the first mask finishes the (lazy) compile
        elapsed = time.perf_counter() - t0
        per = []
        for t in ids:
            t0 = time.perf_counter()
            lt.fill_next_token_bitmask(m, mask)
            per.append(time.perf_counter() - t0)
            assert m.consume_token(t), "llguidance refused the answer"
        if trial:  # trial 0 warms the tokenizer's tables
            compiles.append(elapsed)
            masks += per
    return _summary("llguidance", setup, compiles, masks)


def measure_xgrammar(tokenizer, vocab: int, eos: int, trials: int) -> dict:
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend),
                                              vocab_size=vocab, stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    setup = time.perf_counter() - t0
    ids = tokenizer.encode(json.dumps(ANSWER), add_special_tokens=False)
    compiles, masks = [], []
    mask = xgr.allocate_token_bitmask(1, vocab)
    for trial in range(trials + 1):
        t0 = time.perf_counter()
        matcher = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(_schema(trial)), any_whitespace=True))
        matcher.fill_next_token_bitmask(mask)
        elapsed = time.perf_counter() - t0
        per = []
        for t in ids:
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(mask)
            per.append(time.perf_counter() - t0)
            assert matcher.accept_token(t), "xgrammar refused the answer"
        if trial:
            compiles.append(elapsed)
            masks += per
    return _summary("xgrammar", setup, compiles, masks)


def measure_outlines(tokenizer, vocab: int, eos: int, trials: int) -> dict:
    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema

    t0 = time.perf_counter()
    pieces: dict[str, list[int]] = {}
    for i in range(tokenizer.vocab_size):
        if i != eos:
            pieces.setdefault(tokenizer.backend.id_to_token(i), []).append(i)
    vocabulary = oc.Vocabulary(eos, pieces)
    setup = time.perf_counter() - t0
    compact = json.dumps(ANSWER, separators=(",", ":"))  # outlines' regex: no free whitespace
    ids = tokenizer.encode(compact, add_special_tokens=False)
    compiles, masks = [], []
    for trial in range(min(trials, 2) + 1):  # its index is built up front: seconds a schema
        t0 = time.perf_counter()
        guide = oc.Guide(oc.Index(build_regex_from_schema(json.dumps(_schema(trial))), vocabulary))
        elapsed = time.perf_counter() - t0
        per = []
        for t in ids:
            t0 = time.perf_counter()
            allowed = guide.get_tokens()
            per.append(time.perf_counter() - t0)
            assert t in allowed, "outlines-core refused the answer"
            guide.advance(t)
        if trial:
            compiles.append(elapsed)
            masks += per
    return _summary("outlines-core", setup, compiles, masks)


def _summary(name: str, setup: float, compiles: list[float], masks: list[float]) -> dict:
    return {"library": name, "tokenizer_setup_ms": setup * 1e3, "compile_ms": statistics.median(compiles) * 1e3,
            "mask_us_median": statistics.median(masks) * 1e6,
            "mask_us_p99": sorted(masks)[int(0.99 * (len(masks) - 1))] * 1e6, "tokens": len(masks)}


def measure_all(tokenizer, vocab: int, eos: int, trials: int, peers: bool = True) -> list[dict]:
    """llguidance (strata's), then, with `peers`, xgrammar and outlines-core where importable."""
    out = []
    for fn in (measure_llguidance, measure_xgrammar, measure_outlines)[:None if peers else 1]:
        try:
            out.append(fn(tokenizer, vocab, eos, trials))
        except ImportError as exc:
            out.append({"library": fn.__name__.removeprefix("measure_"), "missing": str(exc)})
    return out
