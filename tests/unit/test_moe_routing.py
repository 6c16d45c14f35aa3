"""Routing (models/moe_block.py `route`) against each family's transformers router on the
same weights, in float32 and bfloat16 (the dtype of the weights each returns differs:
Mixtral keeps float32, the others cast to the logits' dtype); and the checkpoint names
(loader/hf_moe.py): Mixtral's and transformers 5's stacked experts become one expert's
tensors each."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from strata.loader.hf_moe import moe_tensors
from strata.models.moe_block import route
from tests.conftest import require

transformers = require("transformers")

ROUTERS = {  # family: (router class path, config class, renormalise, float32 weights)
    "mixtral": ("mixtral.modeling_mixtral.MixtralTopKRouter", "MixtralConfig", True, True),
    "qwen2_moe": ("qwen2_moe.modeling_qwen2_moe.Qwen2MoeTopKRouter", "Qwen2MoeConfig", False, False),
    "qwen3_moe": ("qwen3_moe.modeling_qwen3_moe.Qwen3MoeTopKRouter", "Qwen3MoeConfig", True, False),
    "olmoe": ("olmoe.modeling_olmoe.OlmoeTopKRouter", "OlmoeConfig", False, False),
}


def hf_router(family: str, experts: int, k: int, hidden: int):
    import importlib

    path, cfg_name, renorm, _ = ROUTERS[family]
    module, cls = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(f"transformers.models.{module}"), cls)
    count = {"num_local_experts": experts} if family == "mixtral" else {"num_experts": experts}
    cfg = getattr(transformers, cfg_name)(hidden_size=hidden, num_experts_per_tok=k, norm_topk_prob=renorm, **count)
    return cls(cfg)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", sorted(ROUTERS))
def test_route_is_the_references(family, dtype):
    gen = torch.Generator().manual_seed(3)
    router = hf_router(family, 16, 4, 32)
    with torch.no_grad():
        router.weight.copy_(torch.randn(16, 32, generator=gen))
    router = router.to(dtype)
    x = torch.randn(9, 32, generator=gen).to(dtype)
    with torch.no_grad():
        _, want_w, want_e = router(x)
    _, _, renorm, float_weights = ROUTERS[family]
    got_w, got_e = route(F.linear(x, router.weight), 4, renorm, float_weights)
    assert got_w.dtype == want_w.dtype == (torch.float32 if float_weights else dtype)
    assert torch.equal(got_e, want_e) and torch.equal(got_w, want_w)
    if renorm:
        assert torch.allclose(got_w.float().sum(-1), torch.ones(9), atol=1e-2)


def test_mixtral_names_become_the_models():
    t = torch.zeros(2, 3)
    assert list(moe_tensors("model.layers.4.block_sparse_moe.experts.7.w3.weight", t))[0][0] == \
        "model.layers.4.mlp.experts.7.up_proj.weight"
    assert list(moe_tensors("model.layers.4.block_sparse_moe.gate.weight", t))[0][0] == "model.layers.4.mlp.gate.weight"
    assert list(moe_tensors("model.layers.4.self_attn.q_proj.weight", t)) == [("model.layers.4.self_attn.q_proj.weight", t)]


def test_stacked_experts_are_split_into_views():
    gate_up = torch.arange(3 * 4 * 5, dtype=torch.float32).reshape(3, 4, 5)  # [E, 2 width, hidden]
    down = torch.arange(3 * 5 * 2, dtype=torch.float32).reshape(3, 5, 2)  # [E, hidden, width]
    got = dict(moe_tensors("model.layers.0.mlp.experts.gate_up_proj", gate_up))
    got |= dict(moe_tensors("model.layers.0.mlp.experts.down_proj", down))
    assert len(got) == 9
    for e in range(3):
        p = f"model.layers.0.mlp.experts.{e}."
        assert torch.equal(got[p + "gate_proj.weight"], gate_up[e, :2])
        assert torch.equal(got[p + "up_proj.weight"], gate_up[e, 2:])
        assert torch.equal(got[p + "down_proj.weight"], down[e])
        assert got[p + "down_proj.weight"].untyped_storage().data_ptr() == down.untyped_storage().data_ptr()
