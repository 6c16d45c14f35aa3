"""4-bit GGUF projections on torch's CPU int4 kernel: what is exact and what is rounded.

The codes never change, and (q - 8) * scale + zero is Q4_0's and Q4_1's formula. The
scale and zero are handed to the kernel in the compute dtype: kept as loaded in float32,
rounded to bfloat16's 8-bit mantissa in bfloat16 compute. These tests pin both down.
"""

from __future__ import annotations

import torch

from strata.models.q4 import GROUP, Q4Weight, pack_for_cpu


def random_q4(out: int, k: int, q4_1: bool, seed: int = 0) -> Q4Weight:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (out, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(out, k // GROUP, generator=g) * 0.05 + 0.001).half().float()  # float16 values, as GGUF stores
    m = (-torch.rand(out, k // GROUP, generator=g) * 0.4).half().float() if q4_1 else torch.zeros_like(d)
    return Q4Weight(codes, d, m + 8 * d if q4_1 else m)


def kernel(x: torch.Tensor, w: Q4Weight) -> torch.Tensor:
    packed, scales_and_zeros = pack_for_cpu(w, x.dtype)
    return torch._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales_and_zeros)


def test_float32_compute_keeps_every_value():
    for q4_1 in (False, True):
        w = random_q4(64, 128, q4_1)
        _, scales_and_zeros = pack_for_cpu(w, torch.float32)
        assert torch.equal(scales_and_zeros[..., 0].T, w.scale) and torch.equal(scales_and_zeros[..., 1].T, w.zero)
        x = torch.randn(5, 128, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(kernel(x, w), x @ w.dequantize().T, rtol=1e-5, atol=1e-5)


def test_bfloat16_compute_rounds_scale_and_zero_to_bfloat16():
    w = random_q4(64, 128, q4_1=True)
    _, scales_and_zeros = pack_for_cpu(w, torch.bfloat16)
    assert scales_and_zeros.dtype == torch.bfloat16
    assert torch.equal(scales_and_zeros[..., 0].T, w.scale.bfloat16())
    assert torch.equal(scales_and_zeros[..., 1].T, w.zero.bfloat16())
    changed = (scales_and_zeros[..., 0].T.float() != w.scale).float().mean().item()
    assert changed > 0.5  # most float16 scales do not fit bfloat16: values do change
    rel = ((scales_and_zeros[..., 0].T.float() - w.scale).abs() / w.scale).max().item()
    assert rel <= 2**-8  # round to nearest with an 8-bit mantissa: at most half a unit (2^-8 relative)


def test_q4_k_maps_onto_the_int4_form_exactly():
    """Q4_K's per-32 scale and min are (q - 8) * scale + zero with scale = d sc, zero = 8 d sc -
    dmin mn: the int4 form holds gguf-py's values (float32), and the kernel multiplies by them."""
    import numpy as np
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import dequantize

    from strata.models.q4 import q4_from_blocks
    from tests.model.tiny_gguf import random_blocks

    raw = random_blocks(QT.Q4_K, 48, 512, np.random.default_rng(3))
    expected = torch.from_numpy(dequantize(raw, QT.Q4_K).reshape(48, 512))
    w = q4_from_blocks(raw, QT.Q4_K, (48, 512))
    assert torch.equal(w.dequantize(), expected)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(kernel(x, w), x @ expected.T, rtol=1e-5, atol=1e-5)
