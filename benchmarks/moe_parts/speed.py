"""moe.py's speed section: prefill and decode (1 and 8 lanes) on a random-weight MoE GGUF.

The file is OLMoE-1B-7B's shape scaled to fit a small machine (`SHAPES`): 64 experts, 8 per
token, q/k norms over the whole projection, as `olmoe` GGUF files lay it out (stacked
`ffn_*_exps`), with the default model's tokenizer; every 2-D weight in `--qtype` (Q4_0 or
Q8_0: the types gguf-py quantizes), norms F32. Random routers route almost uniformly, so a
step touches about as many experts as it can: the heavy case for decode of several lanes.

The arms are decode.py's own (each in its own interpreter, interleaved rounds, same token
ids): strata `--weights auto`, `native`, `dense`, and llama.cpp (`--peers llama.cpp`, when
llama-cpp-python is installed; else left out and the output says so).
"""

from __future__ import annotations

import os

import numpy as np

# name -> OLMoE-like shape (OLMoE-1B-7B: hidden 2048, 16 layers, 16 heads, 64 experts of width 1024, top 8)
SHAPES = {
    "olmoe-scaled": {"hidden": 1024, "layers": 4, "heads": 16, "experts": 64, "used": 8, "width": 512},
    "quick": {"hidden": 256, "layers": 2, "heads": 4, "experts": 64, "used": 8, "width": 256},
}
RMS = 0.05


def describe(shape: dict) -> str:
    return (f"OLMoE-like: hidden {shape['hidden']}, {shape['layers']} layers, {shape['heads']} heads, "
            f"{shape['experts']} experts of width {shape['width']}, top {shape['used']}")


def write_moe_gguf(path: str, shape: dict, qtype_name: str, tokenizer_gguf: str, seed: int = 0) -> str:
    """A random-weight `olmoe` GGUF of `shape` at `path` (kept if it already exists)."""
    if os.path.exists(path):
        return path
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[qtype_name]
    rng = np.random.default_rng(seed)
    reader = GGUFReader(tokenizer_gguf)
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    h, n, e, width = shape["hidden"], shape["heads"], shape["experts"], shape["width"]
    w = GGUFWriter(path + ".part", "olmoe")
    w.add_name(f"random {describe(shape)}")
    for key, value in {"context_length": 4096, "embedding_length": h, "block_count": shape["layers"],
                       "feed_forward_length": width, "attention.head_count": n, "attention.head_count_kv": n,
                       "expert_count": e, "expert_used_count": shape["used"]}.items():
        w.add_uint32(f"olmoe.{key}", value)
    w.add_float32("olmoe.rope.freq_base", 10000.0)
    w.add_float32("olmoe.attention.layer_norm_rms_epsilon", 1e-5)
    for key, f in reader.fields.items():
        if key.startswith("tokenizer."):
            sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
            w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)

    def weight(*dims: int) -> tuple[np.ndarray, object]:
        x = (rng.standard_normal(dims, dtype=np.float32) * RMS)
        q = quantize(x.reshape(-1, dims[-1]), qtype)
        return q.reshape(*dims[:-1], -1), qtype

    def norm(d: int):
        return np.ones(d, np.float32), None

    tensors = {"token_embd.weight": weight(vocab, h), "output_norm.weight": norm(h), "output.weight": weight(vocab, h)}
    for i in range(shape["layers"]):
        b = f"blk.{i}."
        tensors |= {b + "attn_norm.weight": norm(h), b + "attn_q.weight": weight(h, h), b + "attn_k.weight": weight(h, h),
                    b + "attn_v.weight": weight(h, h), b + "attn_output.weight": weight(h, h),
                    b + "attn_q_norm.weight": norm(h), b + "attn_k_norm.weight": norm(h), b + "ffn_norm.weight": norm(h),
                    b + "ffn_gate_inp.weight": (rng.standard_normal((e, h), dtype=np.float32) * RMS, None),
                    b + "ffn_gate_exps.weight": weight(e, width, h), b + "ffn_up_exps.weight": weight(e, width, h),
                    b + "ffn_down_exps.weight": weight(e, h, width)}
    for name, (array, raw) in tensors.items():
        w.add_tensor(name, array, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".part", path)
    return path


SPEEDS = [("prefill_tok_s", "prefill"), ("decode_tok_s", "decode, 1 lane"), ("decode8_tok_s", "decode, 8 lanes")]


def plot_speed(median: dict[str, dict[str, float]], labels: dict[str, str], path: str, title: str) -> None:
    """Each arm's speeds as a multiple of llama.cpp's where it ran, else of strata --weights auto."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = "llama.cpp" if "llama.cpp" in median else next(iter(median))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(median)
    for i, arm in enumerate(median):
        ratios = [median[arm][m] / median[base][m] for m, _ in SPEEDS]
        bars = ax.bar([x + i * width for x in range(len(SPEEDS))], ratios, width, label=labels.get(arm, arm))
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([x + width * (len(median) - 1) / 2 for x in range(len(SPEEDS))], [name for _, name in SPEEDS])
    ax.set_ylabel(f"tokens/s as a multiple of {labels.get(base, base)}")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
