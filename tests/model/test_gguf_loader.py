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
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.errors import LoaderError
from strata.loader import open_model
from strata.loader.gguf_checks import FLOAT_TYPES
from strata.models.quant import KERNEL_TYPES, quant_from_blocks
from strata.sampling import SamplingParams
from strata.testing import prompt_logits
from tests.conftest import require
from tests.model import tiny_gguf
from tests.model.tiny_gguf import VOCAB, random_blocks, write_gguf

transformers = require("transformers")

PROMPT = "The quick brown fox jumps over the lazy dog. Ünïcödé, 日本語, emoji 🙂 and numbers 12345."
NUM_GREEDY = 16

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
# Layer 0 keeps q|k|v and gate|up as Q4_0/Q4_1 (read in place in native mode, as every
# type of models/quant.py KERNEL_TYPES is).
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


def tensor_payload(w: np.ndarray, qtype: QT, rng: np.random.Generator):
    """(array, raw_dtype) for GGUFWriter.add_tensor."""
    if qtype == QT.F32:
        return w.astype(np.float32), None
    if qtype == QT.F16:
        return w.astype(np.float16), None
    if qtype in K_QUANTS:
        return random_blocks(qtype, w.shape[0], w.shape[1], rng, rms=1e-2), qtype
    return quantize(w.astype(np.float32), qtype), qtype


@pytest.fixture(scope="module")
def tokenizer_fields(gguf_path):
    return tiny_gguf.tokenizer_fields(gguf_path)


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


def test_files_cover_every_type_read_in_place():
    used = {t for types in TYPES.values() for t in types.values()} | {QT.F32}
    assert used == set(KERNEL_TYPES | FLOAT_TYPES)  # the rest load dense: test_gguf_native.py


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
    # Layer 0 stores q|k|v and gate|up in Q4_0/Q4_1: native mode keeps only the file's blocks.
    for proj in (layer0.qkv, layer0.gate_up):
        assert proj.quant is not None and proj.weight is None
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


def test_dequantize_equals_gguf_on_smollm2(smol_reader):
    """The real file's Q4_1 projections (first and last layer) and its Q8_0 embedding,
    dequantised by strata's kernels: gguf-py's values, bit for bit."""
    checked = 0
    for t in smol_reader.tensors:
        if t.tensor_type in KERNEL_TYPES and (t.name.startswith(("blk.0.", "blk.29.")) or t.name == "token_embd.weight"):
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            expected = torch.from_numpy(dequantize(np.asarray(t.data), t.tensor_type).reshape(shape))
            assert torch.equal(quant_from_blocks(np.asarray(t.data), t.tensor_type, shape).dequantize(), expected)
            checked += 1
    assert checked == 15


@pytest.fixture(scope="module")
def smol_reader(gguf_path) -> GGUFReader:
    return GGUFReader(gguf_path)


# ---- errors -------------------------------------------------------------------------------

TINY_META = {
    "context_length": 128, "embedding_length": 32, "block_count": 1, "feed_forward_length": 64,
    "attention.head_count": 2, "attention.head_count_kv": 1, "rope.freq_base": 10000.0,
    "attention.layer_norm_rms_epsilon": 1e-5,
}


def tiny_tensors(extra: list | None = None, layer: bool = False, ffn: int = 64) -> list:
    """token_embd and output_norm (and with `layer`, layer 0's tensors, F32, those in `extra` left out)."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32) * 0.02

    tensors = [("token_embd.weight", w(VOCAB, 32).astype(np.float16), None),
               ("output_norm.weight", np.ones(32, np.float32), None)]
    if layer:
        shapes = {"attn_norm.weight": (32,), "attn_q.weight": (32, 32), "attn_k.weight": (16, 32),
                  "attn_v.weight": (16, 32), "attn_output.weight": (32, 32), "ffn_norm.weight": (32,),
                  "ffn_gate.weight": (ffn, 32), "ffn_up.weight": (ffn, 32), "ffn_down.weight": (32, ffn)}
        given = {name for name, _, _ in extra or []}
        tensors += [(f"blk.0.{n}", w(*s), None) for n, s in shapes.items() if f"blk.0.{n}" not in given]
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
    """Q8_K (llama.cpp's activation type) is a type nothing in strata or gguf-py reads."""
    block_size, type_size = GGML_QUANT_SIZES[QT.Q8_K]
    raw = np.random.default_rng(2).integers(0, 256, size=(64, 512 // block_size * type_size), dtype=np.uint8)
    bad = ("blk.0.ffn_down.weight", raw, QT.Q8_K)
    meta = dict(TINY_META, feed_forward_length=512)
    path = write_gguf(str(tmp_path / "q8k.gguf"), "llama", meta, tiny_tensors([bad], layer=True, ffn=512),
                      tokenizer_fields)
    message = assert_loader_error(path, "'blk.0.ffn_down.weight'", "Q8_K", "supported: ")
    assert "Q2_K" in message and "IQ4_XS" in message  # the types it does read
    with pytest.raises(LoaderError, match="Q8_K"):
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

