"""Writing tiny GGUF files as llama.cpp does, for the loader and native-weight tests.

`random_blocks` makes valid blocks of any type gguf-py reads: gguf-py's own quantizer
where it has one, else random code bytes with every float16 scale field set to a small,
finite value (random bytes there can be inf or NaN), scaled so the weights' RMS is `rms`.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

VOCAB = 1024  # the first 1024 SmolLM2 tokens: specials, the 256 bytes, the first merges

# Where each type's float16 scale fields sit in its block (ggml-common.h), for the types
# gguf-py cannot quantize, and their ratio (Q4_K/Q5_K: d / dmin, so the weights centre on 0).
F16_FIELDS = {
    QT.Q2_K: {80: 1.0, 82: 1.0}, QT.Q3_K: {108: 1.0}, QT.Q4_K: {0: 1 / 8, 2: 1.0},
    QT.Q5_K: {0: 1 / 16, 2: 1.0}, QT.Q6_K: {208: 1.0}, QT.IQ4_NL: {0: 1.0}, QT.IQ4_XS: {0: 1.0},
    QT.IQ2_XXS: {0: 1.0}, QT.IQ2_XS: {0: 1.0}, QT.IQ2_S: {0: 1.0}, QT.IQ3_XXS: {0: 1.0},
    QT.IQ3_S: {0: 1.0}, QT.IQ1_S: {0: 1.0},
}


def k4_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 12 scale bytes from 6-bit scales and mins [..., 8] (ggml's packing)."""
    out = np.zeros(sc.shape[:-1] + (12,), np.uint8)
    out[..., 0:4] = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    out[..., 4:8] = (mn[..., :4] & 63) | ((mn[..., 4:] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:] & 0xF) | ((mn[..., 4:] & 0xF) << 4)
    return out
QUANTIZABLE = (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.TQ1_0, QT.TQ2_0, QT.MXFP4)


def random_blocks(qtype: QT, rows: int, cols: int, rng: np.random.Generator, rms: float = 0.05) -> np.ndarray:
    """uint8 [rows, bytes per row] of valid `qtype` blocks whose weights have about RMS `rms`."""
    if qtype in QUANTIZABLE:
        return quantize((rng.standard_normal((rows, cols)) * rms).astype(np.float32), qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    fields = F16_FIELDS[qtype]
    spread = rng.uniform(0.5, 1.5, size=blocks.shape[:2] + (1,))  # each block its own scale
    if qtype in (QT.Q4_K, QT.Q5_K):  # each group's min at its codes' mean: d sc (u - mean)
        sc = rng.integers(16, 64, size=blocks.shape[:2] + (8,), dtype=np.uint8)
        mean = 7.5 if qtype == QT.Q4_K else 15.5
        mn = np.round(sc * mean * fields[0]).astype(np.uint8)
        blocks[..., 4:16] = k4_scales(sc, mn)

    def set_scales(factor: float) -> None:
        for off, ratio in fields.items():
            blocks[..., off:off + 2] = (spread * factor * ratio).astype(np.float16).view(np.uint8)

    set_scales(1.0)
    values = dequantize(blocks.reshape(rows, -1), qtype)
    set_scales(rms / float(np.sqrt(np.mean(values.astype(np.float64) ** 2))))
    out = blocks.reshape(rows, -1)
    assert np.isfinite(dequantize(out, qtype)).all()
    return out


def tokenizer_fields(gguf_path: str) -> list[tuple[str, object, GGUFValueType, GGUFValueType | None]]:
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
               tokenizer_fields, skip: tuple[str, ...] = (), overrides: dict[str, str] | None = None) -> str:
    """A GGUF file: `general.*`, `meta` (keys without the `<arch>.` prefix), the tokenizer
    fields (string fields in `overrides` replaced, e.g. tokenizer.ggml.model)."""
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
        if overrides and key in overrides:
            value = overrides[key]
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, array, raw_dtype in tensors:
        w.add_tensor(name, array, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
