"""The GGUF path end to end: tiny files written here, read by strata and by transformers.

Each file holds the weights of a random tiny Hugging Face model (hidden 256, so K-quant
rows of 256 fit), written the way llama.cpp's converter writes them: llama-arch q/k rows
permuted for its rotary layout, metadata under `<arch>.*`, and the SmolLM2 tokenizer
fields (cut to its first 1024 tokens, see `tokenizer_fields`). The tensors of one file use many types at once, so one file per architecture
covers every type strata claims to read. transformers loads the same file as the
reference (it dequantises with gguf-py and un-permutes llama q/k itself).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.errors import LoaderError
from strata.loader import open_model
from strata.loader.gguf_file import SUPPORTED_TYPES
from strata.models.q4 import q4_from_blocks
from strata.sampling import SamplingParams
from strata.testing import prompt_logits
from tests.conftest import require

transformers = require("transformers")

PROMPT = "The quick brown fox jumps over the lazy dog. Ünïcödé, 日本語, emoji 🙂 and numbers 12345."
NUM_GREEDY = 16
VOCAB = 1024  # the first 1024 SmolLM2 tokens: specials, the 256 bytes, the first merges

# Hugging Face name (after "model.layers.{i}.") -> llama.cpp's GGUF name (after "blk.{i}.").
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}

# Tensor types per GGUF name (anything unnamed is F32, as llama.cpp writes norms and biases).
# Layer 0 keeps q|k|v and gate|up as Q4_0/Q4_1 where the native 4-bit kernel applies.
TYPES = {
    "llama": {
        "token_embd.weight": QT.F16, "output.weight": QT.Q6_K,
        "blk.0.attn_q.weight": QT.Q4_0, "blk.0.attn_k.weight": QT.Q4_0, "blk.0.attn_v.weight": QT.Q4_1,
        "blk.0.attn_output.weight": QT.Q4_K, "blk.0.ffn_gate.weight": QT.Q4_1,
        "blk.0.ffn_up.weight": QT.Q4_0, "blk.0.ffn_down.weight": QT.Q5_K,
        "blk.1.attn_q.weight": QT.BF16, "blk.1.attn_k.weight": QT.F16, "blk.1.attn_v.weight": QT.F32,
        "blk.1.attn_output.weight": QT.Q8_0, "blk.1.ffn_gate.weight": QT.Q5_0,
        "blk.1.ffn_up.weight": QT.Q5_1, "blk.1.ffn_down.weight": QT.Q6_K,
    },
    "qwen2": {  # tied embeddings
        "token_embd.weight": QT.Q8_0,
        "blk.0.attn_q.weight": QT.Q4_1, "blk.0.attn_k.weight": QT.Q4_1, "blk.0.attn_v.weight": QT.Q4_1,
        "blk.0.attn_output.weight": QT.Q6_K, "blk.0.ffn_gate.weight": QT.Q4_0,
        "blk.0.ffn_up.weight": QT.Q4_0, "blk.0.ffn_down.weight": QT.Q4_K,
        "blk.1.attn_q.weight": QT.Q4_0, "blk.1.attn_k.weight": QT.Q8_0, "blk.1.attn_v.weight": QT.BF16,
        "blk.1.attn_output.weight": QT.Q5_K, "blk.1.ffn_gate.weight": QT.Q5_1,
        "blk.1.ffn_up.weight": QT.F16, "blk.1.ffn_down.weight": QT.Q5_0,
        "blk.1.attn_norm.weight": QT.F16, "blk.1.attn_q.bias": QT.F16,
    },
    "qwen3": {
        "token_embd.weight": QT.BF16, "output.weight": QT.Q4_K,
        "blk.0.attn_q.weight": QT.Q4_0, "blk.0.attn_k.weight": QT.Q4_0, "blk.0.attn_v.weight": QT.Q4_0,
        "blk.0.attn_output.weight": QT.Q4_1, "blk.0.ffn_gate.weight": QT.Q4_1,
        "blk.0.ffn_up.weight": QT.Q4_1, "blk.0.ffn_down.weight": QT.Q4_0,
        "blk.1.attn_q.weight": QT.Q6_K, "blk.1.attn_k.weight": QT.Q5_K, "blk.1.attn_v.weight": QT.Q4_K,
        "blk.1.attn_output.weight": QT.F16, "blk.1.ffn_gate.weight": QT.Q5_0,
        "blk.1.ffn_up.weight": QT.Q8_0, "blk.1.ffn_down.weight": QT.Q5_1,
    },
}
SIZES = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 512, "initializer_range": 0.1,
         "bos_token_id": 1, "eos_token_id": 2}
ARCHES = {
    # arch: (config class, overrides, tie embeddings)
    "llama": ("LlamaConfig", {"rms_norm_eps": 1e-5, "rope_theta": 50000.0}, False),
    "qwen2": ("Qwen2Config", {"rms_norm_eps": 1e-6, "rope_theta": 1e6}, True),
    # head_dim 128 != hidden / heads: strata must read attention.key_length (transformers'
    # GGUF reader ignores that key for qwen3 and falls back to Qwen3Config's default, 128).
    "qwen3": ("Qwen3Config", {"rms_norm_eps": 1e-6, "rope_theta": 1e6, "head_dim": 128}, False),
}
K_QUANTS = (QT.Q4_K, QT.Q5_K, QT.Q6_K)  # gguf-py only dequantises these


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    scale = ref.abs().max().item()
    err = (ours - ref).abs().max().item()
    assert err <= 1e-4 * scale, f"max abs error {err:.3g} over logit scale {scale:.3g}"


# ---- writing GGUF files as llama.cpp does ------------------------------------------------


def llama_cpp_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf `permute`: per head, rows [2, d/2] -> [d/2, 2]."""
    return (w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def random_k_quant_blocks(rows: int, cols: int, qtype: QT, rng: np.random.Generator) -> np.ndarray:
    """Valid random K-quant blocks (gguf-py cannot quantise these): random bytes with every
    f16 scale field overwritten by a small finite value; uint8 [rows, bytes per row]."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows, cols // block_size, type_size), dtype=np.uint8)

    def f16(low: float, high: float) -> np.ndarray:
        values = rng.uniform(low, high, size=blocks.shape[:2] + (1,)).astype(np.float16)
        return values.view(np.uint8)

    if qtype in (QT.Q4_K, QT.Q5_K):  # d, dmin, then 6-bit scales/mins and codes
        scale = 1.0 if qtype == QT.Q4_K else 0.5
        blocks[..., 0:2] = f16(1e-4 * scale, 3e-4 * scale)
        blocks[..., 2:4] = f16(2e-4, 6e-4)
    else:  # Q6_K: codes, int8 scales, then d last
        blocks[..., -2:] = f16(2e-5, 6e-5)
    return blocks.reshape(rows, -1)


def tensor_payload(w: np.ndarray, qtype: QT, rng: np.random.Generator):
    """(array, raw_dtype) for GGUFWriter.add_tensor."""
    if qtype == QT.F32:
        return w.astype(np.float32), None
    if qtype == QT.F16:
        return w.astype(np.float16), None
    if qtype in K_QUANTS:
        return random_k_quant_blocks(w.shape[0], w.shape[1], qtype, rng), qtype
    return quantize(w.astype(np.float32), qtype), qtype


@pytest.fixture(scope="module")
def tokenizer_fields(gguf_path) -> list[tuple[str, object, GGUFValueType, GGUFValueType | None]]:
    """The `tokenizer.*` fields of the SmolLM2 GGUF, ready for GGUFWriter.add_key_value, cut to
    its first VOCAB tokens and the merges among them (a prefix of both lists: GPT-2-style ids
    follow merge order). Parsing all 49152 tokens costs GGUFReader ~2.5 s per open."""
    reader = GGUFReader(gguf_path)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()[:VOCAB]
    kept = set(tokens)

    def inside(merge: str) -> bool:
        a, b = merge.split(" ")
        return a in kept and b in kept and a + b in kept

    cut = {
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": reader.fields["tokenizer.ggml.token_type"].contents()[:VOCAB],
        "tokenizer.ggml.merges": [m for m in reader.fields["tokenizer.ggml.merges"].contents() if inside(m)],
    }
    fields = []
    for key, f in reader.fields.items():
        if key.startswith("tokenizer."):
            sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
            fields.append((key, cut.get(key, f.contents()), f.types[0], sub))
    return fields


def write_gguf(path: str, arch: str, meta: dict[str, object], tensors: list[tuple[str, np.ndarray, QT | None]],
               tokenizer_fields, skip: tuple[str, ...] = ()) -> str:
    """A GGUF file: `general.*`, `meta` (keys without the `<arch>.` prefix), the tokenizer."""
    w = GGUFWriter(path, arch)
    w.add_name(f"tiny-{arch}")
    w.add_file_type(1)
    for key, value in meta.items():
        full = f"{arch}.{key}"
        if key in skip:
            continue
        if isinstance(value, float):
            w.add_float32(full, value)
        else:
            w.add_uint32(full, int(value))
    for key, value, vtype, sub in tokenizer_fields:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, array, raw_dtype in tensors:
        w.add_tensor(name, array, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_name(hf_name: str) -> str:
    if hf_name in TOP_NAMES:
        return TOP_NAMES[hf_name]
    _, _, i, rest = hf_name.split(".", 3)
    return f"blk.{i}.{LAYER_NAMES[rest]}"


def make_hf_model(arch: str, vocab_size: int):
    cls_name, overrides, tie = ARCHES[arch]
    torch.manual_seed({"llama": 11, "qwen2": 12, "qwen3": 13}[arch])
    cfg = getattr(transformers, cls_name)(**SIZES, **overrides, vocab_size=vocab_size, tie_word_embeddings=tie)
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def gguf_from_hf(model, arch: str, path: str, tokenizer_fields) -> str:
    cfg = model.config
    rng = np.random.default_rng({"llama": 21, "qwen2": 22, "qwen3": 23}[arch])
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    meta = {
        "context_length": cfg.max_position_embeddings,
        "embedding_length": cfg.hidden_size,
        "block_count": cfg.num_hidden_layers,
        "feed_forward_length": cfg.intermediate_size,
        "attention.head_count": cfg.num_attention_heads,
        "attention.head_count_kv": cfg.num_key_value_heads,
        "rope.freq_base": float(ARCHES[arch][1]["rope_theta"]),
        "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
    }
    if arch == "llama":  # as llama.cpp writes them for this family
        meta["rope.dimension_count"] = head_dim
        meta["vocab_size"] = cfg.vocab_size
    if head_dim != cfg.hidden_size // cfg.num_attention_heads:
        meta["attention.key_length"] = head_dim
        meta["attention.value_length"] = head_dim
    tensors = []
    for hf, value in model.state_dict().items():
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        name = gguf_name(hf)
        w = value.detach().numpy()
        if arch == "llama" and name.endswith("attn_q.weight"):
            w = llama_cpp_permute(w, cfg.num_attention_heads)
        elif arch == "llama" and name.endswith("attn_k.weight"):
            w = llama_cpp_permute(w, cfg.num_key_value_heads)
        array, raw = tensor_payload(w, TYPES[arch].get(name, QT.F32), rng)
        tensors.append((name, array, raw))
    return write_gguf(path, arch, meta, tensors, tokenizer_fields)


@dataclass
class Case:
    arch: str
    path: str
    hf: object  # the random model the file was written from
    ref: object  # transformers' model loaded from the GGUF file


@pytest.fixture(scope="module", params=sorted(ARCHES))
def case(request, tmp_path_factory, tokenizer_fields) -> Case:
    arch = request.param
    hf = make_hf_model(arch, VOCAB)
    folder = tmp_path_factory.mktemp(f"gguf-{arch}")
    path = gguf_from_hf(hf, arch, str(folder / f"tiny-{arch}.gguf"), tokenizer_fields)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()
    return Case(arch, path, hf, ref)


@pytest.fixture(scope="module")
def engines(case) -> dict[str, Engine]:
    def make(weights: str) -> Engine:
        config = EngineConfig(model=case.path, dtype="float32", weights=weights, max_context=256,
                              kv_chunk=16, prefill_chunk=7)
        return Engine(config, progress=False)

    return {"dense": make("dense"), "native": make("native")}


def greedy(engine: Engine, ids: list[int], n: int) -> list[int]:
    rid = engine.submit(ids, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    tokens = []
    for out in engine.run_until_done():
        assert out.error is None
        if out.request_id == rid:
            tokens.extend(out.new_token_ids)
    return tokens


# ---- the files themselves ----------------------------------------------------------------


def test_files_cover_every_supported_type():
    used = {t for types in TYPES.values() for t in types.values()} | {QT.F32}
    assert used == set(SUPPORTED_TYPES)


def test_reference_reads_what_was_written(case):
    """Guards the test's own writer: transformers gives back the HF weights where the
    file stores them losslessly (F32) or by plain rounding (F16, BF16), llama q/k included."""
    ref, hf = case.ref.state_dict(), case.hf.state_dict()
    reader = GGUFReader(case.path)
    types = {t.name: t.tensor_type for t in reader.tensors}
    checked = 0
    for name, value in hf.items():
        if name == "lm_head.weight" and case.hf.config.tie_word_embeddings:
            continue
        rounding = {QT.F32: torch.float32, QT.F16: torch.float16, QT.BF16: torch.bfloat16}.get(
            types[gguf_name(name)])
        if rounding is None:
            continue
        expected = value.to(rounding).to(torch.float32)
        assert torch.equal(ref[name], expected), name
        checked += 1
    assert checked >= 5


# ---- strata against transformers ---------------------------------------------------------


def test_config_matches(case):
    source = open_model(case.path)
    cfg, hf = source.config, case.hf.config
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    assert cfg.arch == case.arch
    assert cfg.vocab_size == hf.vocab_size == VOCAB
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (256, 512, 2)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, head_dim)
    assert cfg.rms_norm_eps == pytest.approx(hf.rms_norm_eps, rel=1e-6)
    assert cfg.rope_theta == ARCHES[case.arch][1]["rope_theta"]
    assert cfg.max_position == hf.max_position_embeddings
    assert cfg.tie_embeddings == hf.tie_word_embeddings
    assert cfg.attention_bias == (case.arch == "qwen2")
    assert cfg.qk_norm == (case.arch == "qwen3")
    assert cfg.rope_scaling is None
    assert cfg.bos_token_id == 1 and 2 in cfg.eos_token_ids
    assert cfg.name == f"tiny-{case.arch}"
    assert source.num_tensors == len(GGUFReader(case.path).tensors)
    ids = source.tokenizer.encode(PROMPT)
    assert source.tokenizer.vocab_size == VOCAB and max(ids) < VOCAB
    assert source.tokenizer.decode(ids) == PROMPT
    assert "<|im_start|>" in source.tokenizer.render_chat([{"role": "user", "content": "hi"}])


def test_dense_logits_match_transformers(case, engines):
    ids = engines["dense"].tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expected = case.ref(torch.tensor([ids])).logits[0].float()
    assert_logits_close(prompt_logits(engines["dense"], ids), expected)


def test_native_logits_match_transformers(case, engines):
    layer0 = engines["native"]._model.layers[0]
    # Layer 0 stores q|k|v and gate|up in Q4_0/Q4_1: native mode keeps only the 4-bit copy.
    for proj in (layer0.qkv, layer0.gate_up):
        assert proj.int4 is not None and proj.weight is None
    ids = engines["dense"].tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expected = case.ref(torch.tensor([ids])).logits[0].float()
    assert_logits_close(prompt_logits(engines["native"], ids), expected)


def test_greedy_matches_transformers(case, engines):
    ids = engines["dense"].tokenizer.encode(PROMPT)
    with torch.inference_mode():
        out = case.ref.generate(torch.tensor([ids]), max_new_tokens=NUM_GREEDY, do_sample=False,
                                eos_token_id=None, pad_token_id=0)
    expected = out[0, len(ids):].tolist()
    assert greedy(engines["dense"], ids, NUM_GREEDY) == expected
    assert greedy(engines["native"], ids, NUM_GREEDY) == expected


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1])
def test_q4_dequantize_equals_gguf(qtype):
    rng = np.random.default_rng(5)
    for shape, offset in (((8, 256), 0.0), ((3, 64), 0.5), ((5, 96), -2.0)):
        w = (rng.standard_normal(shape) * 0.05 + offset).astype(np.float32)
        raw = quantize(w, qtype)
        expected = torch.from_numpy(dequantize(raw, qtype).reshape(shape))
        got = q4_from_blocks(raw, qtype, shape).dequantize()
        assert got.dtype == torch.float32
        assert torch.equal(got, expected)


def test_q4_dequantize_equals_gguf_on_smollm2(smol_reader):
    """The real file's Q4_1 projections (first and last layer): same values, bit for bit."""
    checked = 0
    for t in smol_reader.tensors:
        if t.tensor_type == QT.Q4_1 and t.name.startswith(("blk.0.", "blk.29.")) and len(t.shape) == 2:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            expected = torch.from_numpy(dequantize(np.asarray(t.data), t.tensor_type).reshape(shape))
            assert torch.equal(q4_from_blocks(np.asarray(t.data), t.tensor_type, shape).dequantize(), expected)
            checked += 1
    assert checked == 14


@pytest.fixture(scope="module")
def smol_reader(gguf_path) -> GGUFReader:
    return GGUFReader(gguf_path)


# ---- errors -------------------------------------------------------------------------------

TINY_META = {
    "context_length": 128, "embedding_length": 32, "block_count": 1, "feed_forward_length": 64,
    "attention.head_count": 2, "attention.head_count_kv": 1, "rope.freq_base": 10000.0,
    "attention.layer_norm_rms_epsilon": 1e-5,
}


def tiny_tensors(extra: list | None = None) -> list:
    rng = np.random.default_rng(0)

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32) * 0.02

    tensors = [("token_embd.weight", w(VOCAB, 32).astype(np.float16), None),
               ("output_norm.weight", np.ones(32, np.float32), None)]
    return (extra or []) + tensors


def assert_loader_error(path: str, *needles: str, weights: bool = False) -> str:
    with pytest.raises(LoaderError) as info:
        source = open_model(path)
        if weights:
            list(source.tensors)
    message = str(info.value)
    for needle in (path, *needles):
        assert needle in message, f"{needle!r} not in {message!r}"
    return message


@pytest.fixture(scope="module")
def smol_bytes(gguf_path) -> bytes:
    with open(gguf_path, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def truncation_points(smol_reader) -> dict[str, int]:
    first = min(int(t.data_offset) for t in smol_reader.tensors)
    last_end = max(int(t.data_offset) + int(t.n_bytes) for t in smol_reader.tensors)
    # Every cut past the metadata costs a full parse (~2.5 s), so only two of those.
    return {"header": 10, "metadata": 1000, "tokens": 400_000, "data": (first + last_end) // 2,
            "last-byte": last_end - 1}


@pytest.mark.parametrize("where", ["header", "metadata", "tokens", "data", "last-byte"])
def test_truncated_smollm2_is_a_loader_error(where, truncation_points, smol_bytes, tmp_path):
    n = truncation_points[where]
    path = str(tmp_path / f"truncated-{where}.gguf")
    with open(path, "wb") as f:
        f.write(smol_bytes[:n])
    assert_loader_error(path, "truncated", f"the file has {n}", weights=True)


@pytest.mark.parametrize("prefix", [b"", b"GGUF\x03\x00\x00\x00"])
def test_random_bytes_are_a_loader_error(prefix, tmp_path):
    path = str(tmp_path / "random.gguf")
    with open(path, "wb") as f:
        f.write(prefix + np.random.default_rng(1).integers(0, 256, 8192, dtype=np.uint8).tobytes())
    assert_loader_error(path, weights=True)


def test_missing_file_is_a_loader_error(tmp_path):
    path = str(tmp_path / "nowhere" / "model.gguf")
    assert_loader_error(path, "not found")
    with pytest.raises(LoaderError, match="not found"):
        Engine(EngineConfig(model=path, dtype="float32", max_context=64), progress=False)


def test_unknown_architecture_is_a_loader_error(tmp_path, tokenizer_fields):
    path = write_gguf(str(tmp_path / "gpt2.gguf"), "gpt2", TINY_META, tiny_tensors(), tokenizer_fields)
    assert_loader_error(path, "'gpt2'", "architecture")


@pytest.mark.parametrize("key", ["block_count", "embedding_length", "attention.head_count",
                                 "feed_forward_length", "attention.layer_norm_rms_epsilon"])
def test_missing_metadata_is_a_loader_error(key, tmp_path, tokenizer_fields):
    path = write_gguf(str(tmp_path / "missing.gguf"), "llama", TINY_META, tiny_tensors(), tokenizer_fields,
                      skip=(key,))
    assert_loader_error(path, f"llama.{key}", "missing")


def test_unsupported_tensor_type_is_a_loader_error(tmp_path, tokenizer_fields):
    block_size, type_size = GGML_QUANT_SIZES[QT.IQ2_XXS]
    blocks = np.random.default_rng(2).integers(0, 256, size=(64, 512 // block_size, type_size), dtype=np.uint8)
    blocks[..., 0:2] = np.array([0.01], np.float16).view(np.uint8)  # each block's f16 scale
    raw = blocks.reshape(64, -1)
    bad = ("blk.0.ffn_down.weight", raw, QT.IQ2_XXS)
    meta = dict(TINY_META, feed_forward_length=512)
    path = write_gguf(str(tmp_path / "iq2.gguf"), "llama", meta, tiny_tensors([bad]), tokenizer_fields)
    assert_loader_error(path, "'blk.0.ffn_down.weight'", "IQ2_XXS", weights=True)
    with pytest.raises(LoaderError, match="IQ2_XXS"):
        Engine(EngineConfig(model=path, dtype="float32", weights="dense", max_context=64), progress=False)


def test_unexpected_tensor_name_is_a_loader_error(tmp_path, tokenizer_fields):
    bad = ("blk.0.attn_qkv.weight", np.zeros((64, 32), np.float32), None)
    path = write_gguf(str(tmp_path / "fused.gguf"), "llama", TINY_META, tiny_tensors([bad]), tokenizer_fields)
    assert_loader_error(path, "'blk.0.attn_qkv.weight'", "unexpected", weights=True)


def test_missing_tensor_is_a_loader_error(tmp_path, tokenizer_fields):
    """A file without its layer tensors names the first missing one."""
    path = write_gguf(str(tmp_path / "empty.gguf"), "llama", TINY_META, tiny_tensors(), tokenizer_fields)
    with pytest.raises(LoaderError) as info:
        Engine(EngineConfig(model=path, dtype="float32", weights="dense", max_context=64), progress=False)
    assert path in str(info.value) and "model.layers.0." in str(info.value)

