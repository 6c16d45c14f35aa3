"""Mixture-of-experts GGUF files written here as llama.cpp's converter lays them out (the
experts of a layer stacked in `ffn_{gate,up,down}_exps` [E, out, in], the router
`ffn_gate_inp`, Qwen2-MoE's `*_shexp` and its gate [hidden], Mixtral as `llama` with
experts and q/k rows permuted) against their Hugging Face twin: the same random model with
every weight set to what the file holds (dequantised by gguf-py). Between them the files'
experts use Q8_0, Q4_0, Q4_K, Q6_K, F16 and F32; `--weights dense`, `native` and `auto` each
give the twin's greedy tokens, and native reads each expert's blocks in place, as a view of
its layer's stacked bytes.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf.quants import dequantize

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.errors import LoaderError
from strata.loader import open_model
from strata.testing import prompt_logits
from tests.conftest import require
from tests.model import tiny_gguf
from tests.model.test_gguf_loader import (LAYER_NAMES, PROMPT, TOP_NAMES, assert_logits_close, greedy,
                                          llama_cpp_permute, tensor_payload)
from tests.model.tiny_gguf import VOCAB, write_gguf

transformers = require("transformers")

HIDDEN, WIDTH, EXPERTS, USED = 256, 256, 4, 2
SIZES = {"hidden_size": HIDDEN, "intermediate_size": WIDTH, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 512, "initializer_range": 0.1, "bos_token_id": 1,
         "eos_token_id": 2, "num_experts_per_tok": USED, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
FAMILIES = {  # ModelConfig.arch: (GGUF arch, config class, overrides)
    "mixtral": ("llama", "MixtralConfig", {"num_local_experts": EXPERTS}),
    "qwen2_moe": ("qwen2moe", "Qwen2MoeConfig", {"num_experts": EXPERTS, "moe_intermediate_size": WIDTH,
                                                 "shared_expert_intermediate_size": WIDTH}),
    "qwen3_moe": ("qwen3moe", "Qwen3MoeConfig", {"num_experts": EXPERTS, "moe_intermediate_size": WIDTH,
                                                 "head_dim": 64, "norm_topk_prob": True}),
    "olmoe": ("olmoe", "OlmoeConfig", {"num_experts": EXPERTS, "pad_token_id": 0}),
}
# (gate, up, down) expert types per layer; the shared expert Q8_0; anything else F32.
EXPERT_TYPES = {
    "mixtral": [(QT.Q8_0, QT.Q4_0, QT.Q4_K), (QT.Q6_K, QT.F16, QT.F32)],
    "qwen2_moe": [(QT.Q4_K, QT.Q6_K, QT.Q8_0), (QT.F16, QT.Q4_0, QT.Q6_K)],
    "qwen3_moe": [(QT.Q4_0, QT.Q4_0, QT.Q4_0), (QT.Q8_0, QT.Q8_0, QT.Q6_K)],
    "olmoe": [(QT.F32, QT.F16, QT.Q4_K), (QT.Q4_K, QT.Q4_K, QT.Q4_K)],
}
MOE_NAMES = {"mlp.gate.weight": "ffn_gate_inp.weight", "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
             **{f"mlp.shared_expert.{p}_proj.weight": f"ffn_{p}_shexp.weight" for p in ("gate", "up", "down")}}


@dataclass
class Case:
    arch: str
    path: str
    twin: object  # transformers' model holding the file's weights


def payload(w: np.ndarray, qtype: QT, rng: np.random.Generator):
    """tensor_payload for any rank: rows are the last axis."""
    if w.ndim == 1:
        return tensor_payload(w, qtype, rng)
    array, raw = tensor_payload(w.reshape(-1, w.shape[-1]), qtype, rng)
    return array.reshape(*w.shape[:-1], -1) if w.ndim > 2 else array, raw


def write_file(model, arch: str, path: str, fields, meta_extra: dict | None = None, drop: str | None = None,
               per_expert: bool = False) -> str:
    """The file of `model` (`meta_extra`: more `<arch>.*` keys; `drop`: a tensor left out;
    `per_expert`: one `ffn_{gate,up,down}.{e}` tensor per expert, as older Mixtral files)."""
    gguf_arch, cfg = FAMILIES[arch][0], model.config
    rng = np.random.default_rng(zlib.crc32(arch.encode()))  # not hash(): it changes with PYTHONHASHSEED
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    meta = {"context_length": 512, "embedding_length": HIDDEN, "block_count": 2, "feed_forward_length": WIDTH,
            "attention.head_count": 4, "attention.head_count_kv": 2,
            "rope.freq_base": float(cfg.rope_parameters["rope_theta"]),
            "attention.layer_norm_rms_epsilon": 1e-6, "expert_count": EXPERTS, "expert_used_count": USED}
    if arch in ("qwen2_moe", "qwen3_moe"):
        meta["expert_feed_forward_length"] = WIDTH
    if arch == "qwen2_moe":
        meta["expert_shared_feed_forward_length"] = WIDTH
    if head_dim != HIDDEN // 4:
        meta["attention.key_length"] = meta["attention.value_length"] = head_dim
    tensors = []
    for hf, value in model.state_dict().items():
        w = value.detach().numpy()
        if hf in TOP_NAMES:
            tensors.append((TOP_NAMES[hf], *payload(w, QT.F32, rng)))
            continue
        _, _, i, rest = hf.split(".", 3)
        types = EXPERT_TYPES[arch][int(i)]
        if rest == "mlp.experts.gate_up_proj":  # [E, 2 width, hidden]: gate | up
            gate, up = np.split(w, 2, axis=1)
            tensors.append((f"blk.{i}.ffn_gate_exps.weight", *payload(gate, types[0], rng)))
            tensors.append((f"blk.{i}.ffn_up_exps.weight", *payload(up, types[1], rng)))
        elif rest == "mlp.experts.down_proj":
            tensors.append((f"blk.{i}.ffn_down_exps.weight", *payload(w, types[2], rng)))
        elif rest in MOE_NAMES:
            if rest == "mlp.shared_expert_gate.weight":
                w = w.reshape(-1)  # llama.cpp stores it as [hidden]
            qtype = QT.Q8_0 if "shared_expert." in rest else QT.F32
            tensors.append((f"blk.{i}.{MOE_NAMES[rest]}", *payload(w, qtype, rng)))
        else:
            if gguf_arch == "llama" and rest == "self_attn.q_proj.weight":
                w = llama_cpp_permute(w, cfg.num_attention_heads)
            elif gguf_arch == "llama" and rest == "self_attn.k_proj.weight":
                w = llama_cpp_permute(w, cfg.num_key_value_heads)
            tensors.append((f"blk.{i}.{LAYER_NAMES[rest]}", *payload(w, QT.F32, rng)))
    meta |= meta_extra or {}
    if per_expert:
        tensors = [split for t in tensors for split in per_expert_tensors(*t)]
    return write_gguf(path, gguf_arch, meta, [t for t in tensors if t[0] != drop], fields)


def per_expert_tensors(name: str, array: np.ndarray, raw):
    """A stacked `blk.{i}.ffn_{p}_exps.weight` as one tensor per expert; others unchanged."""
    if not name.endswith("_exps.weight"):
        return [(name, array, raw)]
    _, i, rest = name.split(".", 2)
    proj = rest.removeprefix("ffn_").removesuffix("_exps.weight")
    return [(f"blk.{i}.ffn_{proj}.{e}.weight", np.ascontiguousarray(array[e]), raw) for e in range(len(array))]


def unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of llama_cpp_permute: per head, rows [d/2, 2] -> [2, d/2]."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, -1).transpose(1, 2).reshape(w.shape)


def twin_from_file(model, arch: str, path: str):
    """`model` with every weight replaced by the file's (dequantised by gguf-py; q/k un-permuted)."""
    cfg = model.config
    values = {}
    for t in GGUFReader(path).tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        values[t.name] = torch.from_numpy(np.array(dequantize(np.asarray(t.data), t.tensor_type), np.float32)
                                          ).reshape(shape)
    for i in range(cfg.num_hidden_layers):  # a per-expert file: stack its experts back
        for proj in ("gate", "up", "down"):
            if f"blk.{i}.ffn_{proj}.0.weight" in values:
                values[f"blk.{i}.ffn_{proj}_exps.weight"] = torch.stack(
                    [values.pop(f"blk.{i}.ffn_{proj}.{e}.weight") for e in range(EXPERTS)])
    state = {}
    for hf, value in model.state_dict().items():
        if hf in TOP_NAMES:
            state[hf] = values[TOP_NAMES[hf]]
            continue
        _, _, i, rest = hf.split(".", 3)
        if rest == "mlp.experts.gate_up_proj":
            state[hf] = torch.cat([values[f"blk.{i}.ffn_gate_exps.weight"], values[f"blk.{i}.ffn_up_exps.weight"]], 1)
        elif rest == "mlp.experts.down_proj":
            state[hf] = values[f"blk.{i}.ffn_down_exps.weight"]
        else:
            w = values[f"blk.{i}.{MOE_NAMES.get(rest) or LAYER_NAMES[rest]}"]
            if FAMILIES[arch][0] == "llama" and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
                heads = cfg.num_attention_heads if "q_proj" in rest else cfg.num_key_value_heads
                w = unpermute(w, heads)
            state[hf] = w.reshape(value.shape)
    model.load_state_dict(state)
    return model.eval()


@pytest.fixture(scope="module")
def fields(gguf_path):
    return tiny_gguf.tokenizer_fields(gguf_path)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def case(request, tmp_path_factory, fields) -> Case:
    arch = request.param
    _, cls, overrides = FAMILIES[arch]
    torch.manual_seed(31)
    model = transformers.AutoModelForCausalLM.from_config(
        getattr(transformers, cls)(**SIZES, **overrides, vocab_size=VOCAB), dtype=torch.float32)
    with torch.no_grad():  # routers 4x wider: top-k margins far above float32 summation order's noise
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.mul_(4)
    path = write_file(model, arch, str(tmp_path_factory.mktemp(f"gguf-{arch}") / f"tiny-{arch}.gguf"), fields)
    return Case(arch, path, twin_from_file(model, arch, path))


def engine(case: Case, weights: str) -> Engine:
    return Engine(EngineConfig(model=case.path, dtype="float32", weights=weights, max_context=256, kv_chunk=16,
                               prefill_chunk=7), progress=False)


def test_config_reads_the_experts(case):
    cfg = open_model(case.path).config
    assert cfg.arch == case.arch and cfg.moe_layers == (True, True)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.expert_intermediate_size) == (EXPERTS, USED, WIDTH)
    assert cfg.shared_expert_intermediate_size == (WIDTH if case.arch == "qwen2_moe" else 0)
    assert cfg.norm_topk_prob == (case.arch in ("mixtral", "qwen3_moe"))
    assert cfg.qk_norm_full == (case.arch == "olmoe")


@pytest.mark.parametrize("weights", ["dense", "native", "auto"])
def test_greedy_matches_the_twin(case, weights):
    e = engine(case, weights)
    ids = e.tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expected_logits = case.twin(torch.tensor([ids])).logits[0].float()
        out = case.twin.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)
    assert_logits_close(prompt_logits(e, ids), expected_logits)
    assert greedy(e, ids, 16) == out[0, len(ids):].tolist()


def test_native_reads_each_experts_blocks_in_place(case, quant_ops):
    model = engine(case, "native")._model
    for i, types in enumerate(EXPERT_TYPES[case.arch]):
        experts = model.experts[i]
        assert len(experts) == EXPERTS
        gate_up, down = experts[0].gate_up, experts[0].down
        quantized = [t for t in types if t not in (QT.F16, QT.F32)]
        if types[2] in quantized:  # down: its blocks only, a view of the layer's stacked bytes
            assert down.weight is None
            raws = [e.down.quant.parts[0].raw for e in experts]
            assert len({r.untyped_storage().data_ptr() for r in raws}) == 1
            assert [r.storage_offset() for r in raws] == [e * raws[0].numel() for e in range(EXPERTS)]
        if types[0] in quantized and types[1] in quantized:
            assert gate_up.weight is None and gate_up.quant is not None


def small_model(arch: str):
    _, cls, overrides = FAMILIES[arch]
    return transformers.AutoModelForCausalLM.from_config(
        getattr(transformers, cls)(**SIZES, **overrides, vocab_size=VOCAB), dtype=torch.float32)


@pytest.mark.parametrize("what, needle", [
    ({"meta_extra": {"expert_gating_func": 2}}, "expert_gating_func 2 is not supported"),
    ({"meta_extra": {"expert_weights_scale": 2.5}}, "expert_weights_scale 2.5 is not supported"),
    ({"meta_extra": {"expert_used_count": 9}}, "expert_used_count 9"),
    ({"drop": "blk.1.ffn_up_exps.weight"}, "'blk.1.ffn_up_exps.weight' (layer 1's experts) is missing"),
    ({"drop": "blk.0.ffn_gate_inp.weight"}, "'blk.0.ffn_gate_inp.weight' (layer 0's router) is missing"),
])
def test_bad_moe_files_are_refused_by_name(what, needle, tmp_path, fields):
    path = write_file(small_model("qwen3_moe"), "qwen3_moe", str(tmp_path / "bad.gguf"), fields, **what)
    with pytest.raises(LoaderError) as info:
        open_model(path)
    assert needle in str(info.value), str(info.value)


def test_other_moe_architectures_are_refused_by_name(tmp_path, fields):
    path = write_gguf(str(tmp_path / "deepseek2.gguf"), "deepseek2", {"block_count": 1},
                      [("token_embd.weight", np.zeros((VOCAB, 32), np.float32), None)], fields)
    with pytest.raises(LoaderError) as info:
        open_model(path)
    assert "'deepseek2' is a mixture of experts strata does not run" in str(info.value)


def test_the_prepared_model_cache_maps_the_experts_back(case, tmp_path, monkeypatch):
    """A second start maps the MoE model back (experts, bank remade): the same greedy tokens,
    each layer's experts still views of one stacked buffer under native."""
    from strata.loader import prepared

    monkeypatch.setenv(prepared.CACHE_ENV, str(tmp_path / "cache"))
    first = engine(case, "native")
    ids = first.tokenizer.encode(PROMPT)
    want = greedy(first, ids, 8)
    second = engine(case, "native")
    assert second.info.loaded_from_cache and not first.info.loaded_from_cache
    assert greedy(second, ids, 8) == want
    experts = second._model.experts[0]
    if experts[0].down.quant is not None:
        assert len({e.down.quant.parts[0].raw.untyped_storage().data_ptr() for e in experts}) == 1


def test_a_file_with_one_tensor_per_expert_matches_its_twin(tmp_path, fields):
    """Older Mixtral files (`ffn_gate.{e}` per expert) load as the stacked ones do."""
    torch.manual_seed(32)
    model = small_model("mixtral")
    path = write_file(model, "mixtral", str(tmp_path / "per-expert.gguf"), fields, per_expert=True)
    assert "blk.0.ffn_up.3.weight" in {t.name for t in GGUFReader(path).tensors}
    twin = twin_from_file(model, "mixtral", path)
    e = engine(Case("mixtral", path, twin), "native")
    ids = e.tokenizer.encode(PROMPT)
    with torch.inference_mode():
        out = twin.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert greedy(e, ids, 12) == out[0, len(ids):].tolist()
