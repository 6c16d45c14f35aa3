"""The default serving path's accuracy against transformers: a bound a broken scale or head fails.

What `strata serve` runs by default: bfloat16 compute, `--weights auto` (the GGUF's Q4_1
projections through strata's x8 kernel at steps of at most 4 rows (8 without AMX), 15-bit
activations per 32 values; $STRATA_Q4_KERNEL=int4: torch's int4 kernel, bf16 activations and
per-32 scales and zeros rounded to bfloat16; =x8-int8: the x8 kernel with 8-bit activations,
measured on an AMD EPYC: top-1 96.4 % / mean |diff| 0.366 against bfloat16, outside the
bound); the LM head read as per-row int8 at steps of at most 4 rows, or where torch's kernels
run their AVX2 path the file's Q8_0 head in place (models/head.py head_kernel, 8-bit
activations per 32 values), or where strata's kernels run AVX-512 VNNI the Q8_0 head's q8x8
form (the file's values, 8-bit activations per 32 values, steps of at most 16 rows); prompt rows read the
dense weights). Every position here is computed by those
kernels: each prompt's greedy continuation is decoded by the engine itself, then prompt and
continuation are read back 4 tokens a step (`--prefill-chunk 4`) as decode rows
(`prompt_logits(..., as_decode=True)`, as a verify step reads its drafts). The references
are transformers on the same GGUF file in float32 and in bfloat16, over the same tokens.

Per reference: top-1 agreement over every position (prompt and continuation) and the mean
|logit difference| over every logit; and the engine's own greedy tokens against the
reference's argmax after the same prefix. Measured on this prompt set (363 positions), the
x8 path on an AMD EPYC (AVX-512 VNNI), a piece's rows read by the fused decode attention as
a verify step's are: top-1 98.4 % / mean |diff| 0.205 against float32, 97.3 % / 0.187
against bfloat16; the int4 path on a Sapphire Rapids guest with AMX, torch
2.13: 98.6 % / 0.187 against float32, 97.5 % / 0.198 against bfloat16 (on the EPYC 96.7 % /
0.213 against bfloat16; transformers' own bfloat16 against its float32: 97.4 % / 0.156).
Against float32 every 4-bit scale 2 % off falls to 1.7 % / 7.7 (x8), an int8 head whose
codes are truncated instead of rounded to 97.0 % / 0.233 (x8; 95.3 % / 0.22 with int4), a
Q8_0 head whose codes are each one step nearer zero to 97.3 % / 0.242 (x8, Zen 3):
the bounds can fail. The
breaks are made in the built engine's own weights (the 4-bit scales the kernel reads, the
head's int8 codes), the same values a loader with the break would have built.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from strata.config import EngineConfig, q4_kernel_from_env
from strata.engine.engine import Engine
from strata.models.fused_layer import FusedDecodeLayer
from strata.models.head import Int8Head, Int8Rows, QuantHead, X8Head
from strata.models.q4x8 import Q8_RECORD, RECORD, X8Matmul
from strata.models.quant import QuantMatmul, QuantWeight
from strata.sampling import SamplingParams
from strata.testing import prompt_logits
from tests.conftest import FUSED_ONLY, require

CHATS = ["Write a haiku about tides.", "Why is the sky blue?", "What is 17 times 23?",
         "Give me three tips for a job interview.", "Explain photosynthesis to a ten-year-old."]
CODE = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
NEW = 16
# reference -> (least top-1 agreement, largest mean |logit difference>), per (4-bit path, head):
# the x8 path's top-1 is higher, so against float32 its top-1 bound with the int8 head is
# tighter (with int4's, the int8 head break would pass under x8); int4's is also the dense
# projections' (no kernels built). With the file's Q8_0 head in place (an AVX2-only CPU), the
# head break is caught by the mean difference, and top-1 against float32 was measured lower
# (97.3 % / 0.201 on a Zen 3 EPYC; 99.7 % / 0.178 against bfloat16). The q8x8 head (the same
# file values, 15-bit activations; a Zen 4 EPYC): 97.5 % / 0.193 against float32, 99.2 % / 0.177
# against bfloat16 (the int8 head there: 98.4 % / 0.205, 97.3 % / 0.187); its break 97.3 % / 0.235.
# With the decode attention's weighted values by vdpbf16ps and the norms' 8-lane sums (the same
# CPU): 98.9 % / 0.172 against float32, 97.5 % / 0.178 against bfloat16, the break 99.2 % / 0.208
# (within 0.22: the mean bound for this pair is 0.20 against float32). The q8x8 head on 8-bit
# activations (models/head.py X8_HEAD_ACT_BITS; the same CPU): 98.9 % / 0.178 against float32,
# 97.8 % / 0.183 against bfloat16, the break 98.9 % / 0.211.
INT4 = {"float32": (0.97, 0.22), "bfloat16": (0.95, 0.24)}
BOUNDS = {("int4", "int8"): INT4, ("int4", "quant"): INT4,
          ("x8", "int8"): {"float32": (0.98, 0.22), "bfloat16": (0.95, 0.24)},
          ("x8", "quant"): {"float32": (0.965, 0.22), "bfloat16": (0.95, 0.24)},
          ("x8", "x8"): {"float32": (0.965, 0.20), "bfloat16": (0.95, 0.24)}}
REFERENCES = ("bfloat16", "float32")
MIN_GREEDY = 0.9  # the engine's greedy tokens that are the reference's argmax after the same prefix


def projections(model):
    for layer in model.layers:
        yield from (layer.qkv, layer.o, layer.gate_up, layer.down)


@pytest.fixture(scope="module")
def engine(gguf_path) -> Engine:
    e = Engine(EngineConfig(model=gguf_path, dtype="bfloat16", weights="auto", max_context=512, prefill_chunk=4),
               progress=False)
    model = e._model  # the path under test: every projection's int4 form at steps of 4 decode rows
    # the head's decode rows: torch's int8 kernel on a per-row int8 copy, or (where torch's kernels
    # run their AVX2 path, models/head.py head_kernel) the file's Q8_0 blocks in place, or (AVX-512
    # VNNI) their q8x8 form
    assert isinstance(model.lm_head, (Int8Head, QuantHead, X8Head)) and model.lm_head.max_rows >= 4
    if FUSED_ONLY:  # a CPU without AVX2 serves the dense projections (no kernels read the blocks)
        form = "int4" if q4_kernel_from_env() == "int4" else "x8"  # int4: $STRATA_Q4_KERNEL=int4
        assert all(getattr(proj, form) is not None and proj.max_rows >= 4 for proj in projections(model))
    return e


@pytest.fixture(scope="module")
def sequences(engine) -> list[tuple[list[int], list[int]]]:
    """(prompt, the serving engine's greedy continuation) per prompt, and the engine's logits."""
    tok = engine.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": c}]) for c in CHATS]
    prompts.append(tok.encode_chat([{"role": "user", "content": f"Explain this code:\n```\n{CODE}```"}]))
    out = []
    for p in prompts:
        request_id = engine.submit(p, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True))
        cont = [t for o in engine.stream(request_id) for t in o.new_token_ids]
        out.append((p, cont))
    engine._scheduler.clear_cache()
    return out, [prompt_logits(engine, p + c, as_decode=True) for p, c in out]


@pytest.fixture(scope="module")
def references(gguf_path, sequences) -> dict[str, list[torch.Tensor]]:
    transformers = require("transformers")
    seqs, _ = sequences
    refs = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=dtype).eval()
        with torch.inference_mode():
            refs[name] = [model(torch.tensor([p + c])).logits[0].float() for p, c in seqs]
        del model
    return refs


def agreement(ours: list[torch.Tensor], refs: list[torch.Tensor]) -> tuple[float, float]:
    """(top-1 agreement over positions, mean |logit difference| over every logit)."""
    positions = sum(r.shape[0] for r in refs)
    top1 = sum((a.argmax(-1) == b.argmax(-1)).sum().item() for a, b in zip(ours, refs)) / positions
    mean_abs = sum((a - b).abs().sum(dtype=torch.float64).item() for a, b in zip(ours, refs)) / sum(
        r.numel() for r in refs)
    return top1, mean_abs


def bounds(engine) -> dict[str, tuple[float, float]]:
    """BOUNDS of the 4-bit path the engine's projections read and of its head's decode rows."""
    four_bit = "x8" if any(p.x8 is not None for p in projections(engine._model)) else "int4"
    head = engine._model.lm_head
    return BOUNDS[four_bit, "quant" if isinstance(head, QuantHead) else "x8" if isinstance(head, X8Head) else "int8"]


def within(top1: float, mean_abs: float, bound: tuple[float, float]) -> bool:
    least_top1, most_abs = bound
    return top1 >= least_top1 and mean_abs <= most_abs


@pytest.mark.parametrize("reference", REFERENCES)
def test_the_default_serving_path_is_within_the_bounds(engine, sequences, references, reference):
    seqs, ours = sequences
    top1, mean_abs = agreement(ours, references[reference])
    greedy = [int(ref[len(p) - 1 + i].argmax()) == t for (p, c), ref in zip(seqs, references[reference])
              for i, t in enumerate(c)]
    print(f"serving path vs transformers {reference}: top-1 {top1:.4f}, mean |logit diff| {mean_abs:.4f}, "
          f"greedy tokens agreeing {sum(greedy)}/{len(greedy)} over {sum(r.shape[0] for r in ours)} positions")
    assert within(top1, mean_abs, bounds(engine)[reference]), (top1, mean_abs, bounds(engine)[reference])
    assert sum(greedy) / len(greedy) >= MIN_GREEDY


def scale_off(int4: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's int4 form (packed codes, scales_and_zeros [in / 32, out, 2]) with every group's
    scale 2 % too large."""
    packed, scales_and_zeros = int4
    scales_and_zeros = scales_and_zeros.clone()
    scales_and_zeros[..., 0] *= 1.02
    return packed, scales_and_zeros


def scale_off_x8(x8: X8Matmul) -> X8Matmul:
    """The x8 form (models/q4x8.py: per block and group of 8 columns, d[8] float16 first) with
    every block's scale 2 % too large."""
    records = x8.packed.numpy().reshape(x8.packed.shape[0], -1, RECORD).copy()
    d = records[..., :16].copy().view(np.float16).astype(np.float32) * 1.02
    records[..., :16] = d.astype(np.float16).view(np.uint8)
    return X8Matmul(torch.from_numpy(records.reshape(x8.packed.shape)), x8.out_features, x8.in_features,
                    x8.act_bits)


def truncated(weight: torch.Tensor) -> Int8Rows:
    """Int8Rows.quantize with codes truncated toward zero instead of rounded to nearest."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127).to(weight.dtype).float().clamp_min(torch.finfo(torch.float32).tiny)
    return Int8Rows((w / scale.unsqueeze(1)).clamp_(-127, 127).to(torch.int8), scale.to(weight.dtype))


def codes_toward_zero(quant: QuantMatmul) -> QuantMatmul:
    """The head's Q8_0 blocks (float16 d, then 32 int8 codes) with every nonzero code one step
    nearer zero."""
    (part,) = quant.parts
    assert part.qtype == int(QT.Q8_0), "the default model's head is Q8_0"
    blocks = part.raw.numpy().reshape(part.out_features, -1, 34).copy()
    codes = blocks[..., 2:].view(np.int8)
    codes -= np.sign(codes).astype(np.int8)
    raw = torch.from_numpy(blocks.reshape(part.raw.shape))
    return QuantMatmul([QuantWeight(raw, part.qtype, part.in_features)])


def codes_toward_zero_q8x8(x8: X8Matmul) -> X8Matmul:
    """The q8x8 form (models/q4x8.py: per block and group, d[8] float16 then codes + 128) with
    every nonzero code one step nearer zero, as `codes_toward_zero` in the file's blocks."""
    records = x8.packed.numpy().reshape(x8.packed.shape[0], -1, Q8_RECORD).copy()
    u = records[..., 16:].astype(np.int16)
    records[..., 16:] = (u - np.sign(u - 128)).astype(np.uint8)
    return X8Matmul(torch.from_numpy(records.reshape(x8.packed.shape)), x8.out_features, x8.in_features,
                    x8.act_bits, x8.weight_bits)


@pytest.mark.parametrize("broken", ["4-bit scale"] * len(FUSED_ONLY) + ["head rounding"])
def test_a_broken_scale_or_head_falls_outside_the_bounds(engine, sequences, references, broken, monkeypatch):
    model = engine._model  # monkeypatch puts every weight back after the test
    if broken == "4-bit scale":
        for proj in projections(model):
            if proj.x8 is not None:
                monkeypatch.setattr(proj, "x8", scale_off_x8(proj.x8))
            else:
                monkeypatch.setattr(proj, "int4", scale_off(proj.int4))
        for layer in model.layers:  # the layers' one-call forms read the broken kernels too
            monkeypatch.setattr(layer, "fused", FusedDecodeLayer.build(layer, model.ops))
    elif isinstance(model.lm_head, QuantHead):
        monkeypatch.setattr(model.lm_head, "quant", codes_toward_zero(model.lm_head.quant))
    elif isinstance(model.lm_head, X8Head):
        monkeypatch.setattr(model.lm_head, "x8", codes_toward_zero_q8x8(model.lm_head.x8))
    else:
        monkeypatch.setattr(model.lm_head, "int8", truncated(model.lm_head.weight))
    seqs, _ = sequences
    ours = [prompt_logits(engine, p + c, as_decode=True) for p, c in seqs]
    top1, mean_abs = agreement(ours, references["float32"])
    print(f"{broken} broken: top-1 {top1:.4f}, mean |logit diff| {mean_abs:.4f} against float32")
    assert not within(top1, mean_abs, bounds(engine)["float32"])
