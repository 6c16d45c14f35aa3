"""The mixture-of-experts families against transformers on tiny random configs (float32, eager
experts): prompt logits read in pieces, greedy decoding, one lane and several at once, on
every decode path this CPU has.

Each config routes 8 experts, 2 or 3 per token, so a prompt's rows spread over every
expert; Qwen2-MoE has its sigmoid-gated shared expert, no renormalisation and one dense
layer (mlp_only_layers); Qwen3-MoE renormalises and norms q/k per head; OLMoE norms q/k over
the whole projection; Mixtral renormalises and keeps float32 router weights.
"""

from __future__ import annotations

import pytest
import torch

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.llm import LLM
from strata.sampling import SamplingParams
from strata.testing import prompt_logits
from tests.conftest import make_tiny_model, require
from tests.model.test_parity import PROMPT, assert_logits_close

transformers = require("transformers")

EXPERTS = {"num_hidden_layers": 3, "num_experts_per_tok": 2}
MOE_CASES = {
    "mixtral": ("mixtral", {**EXPERTS, "num_local_experts": 8, "intermediate_size": 48}),
    "qwen2_moe": ("qwen2_moe", {**EXPERTS, "num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 32,
                                "shared_expert_intermediate_size": 80, "mlp_only_layers": [1],
                                "norm_topk_prob": False}),
    "qwen3_moe": ("qwen3_moe", {**EXPERTS, "num_experts": 8, "moe_intermediate_size": 32, "head_dim": 32,
                                "norm_topk_prob": True}),
    "olmoe": ("olmoe", {**EXPERTS, "num_experts": 8, "intermediate_size": 32, "norm_topk_prob": False,
                        "pad_token_id": 0, "eos_token_id": 2}),
}
PROMPTS = [PROMPT, "Hello there, how are you today?", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12"]
NEW = 24


def tiny_moe_dir(case: str, tmp_path_factory, tokenizer) -> str:
    arch, overrides = MOE_CASES[case]
    return make_tiny_model(arch, str(tmp_path_factory.mktemp(f"tiny-{case}")), tokenizer, **overrides)


@pytest.fixture(scope="module", params=sorted(MOE_CASES))
def tiny(request, tmp_path_factory, smol_tokenizer):
    path = tiny_moe_dir(request.param, tmp_path_factory, smol_tokenizer)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return request.param, path, ref


def hf_greedy(ref, ids: list[int], n: int = NEW) -> list[int]:
    with torch.inference_mode():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_the_config_reads_the_experts(tiny):
    from strata.loader.hf_dir import hf_model_config

    case, path, ref = tiny
    cfg = hf_model_config(path)
    overrides = MOE_CASES[case][1]
    assert cfg.arch == case and cfg.num_experts == 8
    assert cfg.experts_per_token == overrides["num_experts_per_tok"]
    assert cfg.moe_layers == ((True, False, True) if case == "qwen2_moe" else (True, True, True))
    assert cfg.norm_topk_prob == (case != "qwen2_moe" and overrides.get("norm_topk_prob", True))
    assert cfg.shared_expert_intermediate_size == (80 if case == "qwen2_moe" else 0)
    assert cfg.qk_norm == (case in ("qwen3_moe", "olmoe")) and cfg.qk_norm_full == (case == "olmoe")
    # the routers are random (a zero router would route every row alike, hiding routing bugs)
    routers = [p for n, p in ref.named_parameters() if n.endswith("mlp.gate.weight")]
    assert routers and all(p.std() > 0.01 for p in routers)


def test_moe_logits_match_transformers(tiny, smol_tokenizer, decode_path):
    case, path, ref = tiny
    ids = smol_tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expected = ref(torch.tensor([ids])).logits[0].float()
    engine = Engine(EngineConfig(model=path, dtype="float32", max_context=256, kv_chunk=16, prefill_chunk=7,
                                 fused=decode_path == "fused"), progress=False)
    assert_logits_close(prompt_logits(engine, ids), expected)


def test_moe_greedy_matches_transformers(tiny, smol_tokenizer, decode_path):
    case, path, ref = tiny
    ids = smol_tokenizer.encode(PROMPT)
    llm = LLM(model=path, dtype="float32", max_context=256, kv_chunk=64, batch=1, fused=decode_path == "fused",
              progress=False)
    (got,) = llm.generate([ids], SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True))
    assert list(got.token_ids) == hf_greedy(ref, ids)


def test_moe_lanes_together_match_transformers(tiny, smol_tokenizer):
    """Three lanes decode together (each step's rows come from every lane, routed apart)."""
    case, path, ref = tiny
    prompts = [smol_tokenizer.encode(p) for p in PROMPTS]
    llm = LLM(model=path, dtype="float32", max_context=256, kv_chunk=16, batch=3, prefill_chunk=9, progress=False)
    got = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True))
    assert [list(g.token_ids) for g in got] == [hf_greedy(ref, ids) for ids in prompts]


def test_routing_matters(tiny, smol_tokenizer, monkeypatch):
    """Routing every row to experts 0..k-1 instead gives other logits (the tests above can fail)."""
    import strata.models.moe_block as moe_block

    case, path, ref = tiny
    ids = smol_tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expected = ref(torch.tensor([ids])).logits[0].float()
    real = moe_block.route

    def first_k(logits, k, renormalise, float_weights):
        weights, experts = real(logits, k, renormalise, float_weights)
        return weights, torch.arange(k).expand_as(experts)

    monkeypatch.setattr(moe_block, "route", first_k)
    engine = Engine(EngineConfig(model=path, dtype="float32", max_context=256, kv_chunk=16), progress=False)
    assert (prompt_logits(engine, ids) - expected).abs().max() > 1e-3
