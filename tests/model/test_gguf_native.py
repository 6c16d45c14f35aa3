"""--weights native on tiny GGUF files of every type strata reads, and refusals that come first.

One file per type: a random two-layer Llama (hidden 256, so K-quant rows fit) whose every
matrix (embedding, projections, head; tied for some types) is stored in that type, written
with gguf.GGUFWriter as llama.cpp lays it out (q/k rows permuted). `--weights native` must
hold the file's blocks (no dense copy) and give the dense dequantised model's greedy tokens
in float32, where the kernels meet float32 activations with the blocks' exact values.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.errors import LoaderError
from strata.loader import fingerprint, gguf_tensors, open_model
from strata.loader.tokenizer import Tokenizer
from strata.models.head import QuantHead
from strata.models.quant import KERNEL_TYPES
from strata.sampling import SamplingParams
from strata.testing import prompt_logits
from tests.conftest import FUSED_ONLY, require, require_quant_ops
from tests.model import tiny_gguf
from tests.model.tiny_gguf import VOCAB, random_blocks, write_gguf

require("gguf")

KERNEL = sorted(KERNEL_TYPES)
DENSE_ONLY = [QT.Q2_K, QT.Q3_K, QT.IQ4_NL, QT.IQ4_XS, QT.IQ2_XXS, QT.TQ2_0]
TIED = {QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.Q6_K}  # these files tie the head to the embedding
HIDDEN, FFN, HEADS, KV_HEADS = 256, 512, 4, 2
META = {"context_length": 512, "embedding_length": HIDDEN, "block_count": 2, "feed_forward_length": FFN,
        "attention.head_count": HEADS, "attention.head_count_kv": KV_HEADS, "rope.freq_base": 10000.0,
        "attention.layer_norm_rms_epsilon": 1e-5, "rope.dimension_count": HIDDEN // HEADS, "vocab_size": VOCAB}
SHAPES = {"attn_q.weight": (HIDDEN, HIDDEN), "attn_k.weight": (128, HIDDEN), "attn_v.weight": (128, HIDDEN),
          "attn_output.weight": (HIDDEN, HIDDEN), "ffn_gate.weight": (FFN, HIDDEN),
          "ffn_up.weight": (FFN, HIDDEN), "ffn_down.weight": (HIDDEN, FFN)}
PROMPT = "The lighthouse keeper climbed the stairs and watched the ships."


@pytest.fixture(scope="module")
def fields(gguf_path):
    return tiny_gguf.tokenizer_fields(gguf_path)


def tiny_file(folder, qtype: QT, fields, tied: bool, odd: list | None = None, arch: str = "llama",
              overrides: dict | None = None, drop: tuple[str, ...] = ()) -> str:
    """A two-layer model with every matrix in `qtype` (norms F32); `odd` replaces or adds
    tensors, `drop` leaves some out."""
    rng = np.random.default_rng(int(qtype))
    tensors = [("token_embd.weight", random_blocks(qtype, VOCAB, HIDDEN, rng, rms=0.5), qtype),
               ("output_norm.weight", 1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32), None)]
    if not tied:
        tensors.append(("output.weight", random_blocks(qtype, VOCAB, HIDDEN, rng, rms=0.1), qtype))
    for i in range(2):
        for name in ("attn_norm.weight", "ffn_norm.weight"):
            tensors.append((f"blk.{i}.{name}", 1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32), None))
        for name, (rows, cols) in SHAPES.items():
            tensors.append((f"blk.{i}.{name}", random_blocks(qtype, rows, cols, rng, rms=0.08), qtype))
    for bad in odd or []:
        tensors = [t for t in tensors if t[0] != bad[0]] + [bad]
    tensors = [t for t in tensors if t[0] not in drop]
    return write_gguf(str(folder / f"tiny-{qtype.name}.gguf"), arch, META, tensors, fields, overrides=overrides)


def engine(path: str, weights: str, dtype: str = "float32") -> Engine:
    return Engine(EngineConfig(model=path, dtype=dtype, weights=weights, max_context=128, kv_chunk=16,
                               prefill_chunk=5), progress=False)


def greedy(e: Engine, ids: list[int], n: int = 16) -> list[int]:
    e.submit(ids, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    return [t for out in e.run_until_done() for t in out.new_token_ids]


@pytest.fixture(scope="module", params=KERNEL, ids=[t.name for t in KERNEL])
def kernel_file(request, tmp_path_factory, fields) -> tuple[QT, str]:
    qtype = request.param
    return qtype, tiny_file(tmp_path_factory.mktemp(qtype.name), qtype, fields, tied=qtype in TIED)


def test_native_holds_the_files_blocks(kernel_file, quant_ops):
    """The kernels read the file's blocks in place (a CPU without them loads dense: the other
    tests here check that path)."""
    qtype, path = kernel_file
    model = engine(path, "native")._model
    stored = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors if t.tensor_type == qtype}
    held = 0
    for layer in model.layers:
        for proj in (layer.qkv, layer.o, layer.gate_up, layer.down):
            assert proj.weight is None and proj.quant is not None
            assert all(p.qtype == int(qtype) for p in proj.quant.parts)
            held += proj.quant.num_bytes
    assert model.embedding.weight is None and model.embedding.quant.qtype == int(qtype)
    held += model.embedding.quant.num_bytes
    assert isinstance(model.lm_head, QuantHead) and model.lm_head.weight is None
    if qtype in TIED:  # the head reads the embedding's own bytes
        assert model.lm_head.quant.parts[0].raw.data_ptr() == model.embedding.quant.raw.data_ptr()
    else:
        held += model.lm_head.quant.num_bytes
    assert held == sum(stored.values())


def test_native_greedy_equals_dense(kernel_file):
    """float32: the same tokens, and logits as close as float32 summation order allows."""
    _, path = kernel_file
    dense, native = engine(path, "dense"), engine(path, "native")
    ids = dense.tokenizer.encode(PROMPT)
    expected = prompt_logits(dense, ids)
    got = prompt_logits(native, ids)
    assert (got - expected).abs().max().item() <= 1e-4 * expected.abs().max().item()
    assert len(set(expected.argmax(dim=-1).tolist())) > 3  # the model answers its input: a wrong weight shows
    assert greedy(native, ids) == greedy(dense, ids)


def test_native_bfloat16_reads_8_bit_activations_close_to_dense(kernel_file):
    """bfloat16: 8-bit activations (the kernels' bound: tests/unit/test_quant_kernels.py); the
    whole model stays within a few percent of the dense float32 logits. A misplaced row or
    part would be off by the logits' own size."""
    _, path = kernel_file
    dense, native = engine(path, "dense"), engine(path, "native", "bfloat16")
    ids = dense.tokenizer.encode(PROMPT)
    expected = prompt_logits(dense, ids)
    got = prompt_logits(native, ids)
    assert (got - expected).abs().max().item() <= 0.05 * expected.abs().max().item()


@pytest.mark.parametrize("qtype", DENSE_ONLY, ids=[t.name for t in DENSE_ONLY])
def test_types_without_a_kernel_load_dense_with_one_warning(qtype, tmp_path, fields, caplog):
    path = tiny_file(tmp_path, qtype, fields, tied=False)
    with caplog.at_level(logging.WARNING, logger="strata.loader"):
        native = engine(path, "native")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and qtype.name in warnings[0] and "MiB in float32" in warnings[0], warnings
    assert all(layer.qkv.weight is not None and layer.qkv.quant is None for layer in native._model.layers)
    dense = engine(path, "dense")
    ids = dense.tokenizer.encode(PROMPT)
    assert greedy(native, ids) == greedy(dense, ids)


def test_without_the_kernels_every_quantized_type_loads_dense_with_one_warning(tmp_path, fields, caplog, monkeypatch):
    """No in-place kernel in this process (not built, or no AVX2): native and auto hold dense
    weights, and say so once, naming the types; the memory guard counts the dense copy."""
    import strata.engine.build as build
    import strata.loader as loader
    import strata.models.head as head
    import strata.models.layers as layers
    import strata.models.linear as linear

    for module in (loader, build, linear, head, layers):
        monkeypatch.setattr(module, "load_quant_ops", lambda: None)
    plans = []
    monkeypatch.setattr(build, "check_memory", lambda plan, *a: plans.append(plan))
    path = tiny_file(tmp_path, QT.Q4_K, fields, tied=False)
    with caplog.at_level(logging.WARNING, logger="strata.loader"):
        native = engine(path, "native")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Q4_K (16 tensors)" in warnings[0] and "kernels are not built" in warnings[0], warnings
    assert all(layer.qkv.weight is not None and layer.qkv.quant is None for layer in native._model.layers)
    dense = engine(path, "dense")
    assert plans[0].weight_bytes == plans[1].weight_bytes  # no file's blocks counted beside the dense copy
    ids = dense.tokenizer.encode(PROMPT)
    assert greedy(native, ids) == greedy(dense, ids)


# ---- refusals come first -------------------------------------------------------------------


@pytest.fixture
def spies(monkeypatch) -> list[str]:
    """Names of the loader's tensor readers, the fingerprint and the vocabulary parse, as called."""
    calls: list[str] = []
    for owner, name in ((gguf_tensors, "read_raw"), (gguf_tensors, "dequantize"),
                        (fingerprint, "weights_fingerprint")):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _real=real, _name=name, **kw: calls.append(_name) or _real(*a, **kw))
    real_vocab = Tokenizer.from_gguf.__func__
    monkeypatch.setattr(Tokenizer, "from_gguf",
                        classmethod(lambda cls, *a: calls.append("from_gguf") or real_vocab(cls, *a)))
    return calls


def test_spies_see_an_accepted_file_read(spies, tmp_path, fields):
    path = tiny_file(tmp_path, QT.Q4_K, fields, tied=False)
    list(open_model(path, weights="auto").tensors)
    assert {"read_raw", "dequantize", "weights_fingerprint", "from_gguf"} <= set(spies)


REFUSALS = {
    "tensor type": (dict(odd=[("blk.1.ffn_up.weight", np.zeros((FFN, 292), np.uint8), QT.Q8_K)]),
                    ["'blk.1.ffn_up.weight'", "Q8_K", "supported: "]),
    "architecture": (dict(arch="gpt2"), ["architecture 'gpt2'"]),
    "tokenizer kind": (dict(overrides={"tokenizer.ggml.model": "bert"}), ["tokenizer.ggml.model 'bert'"]),
    "unexpected tensor": (dict(odd=[("blk.0.attn_qkv.weight", np.zeros((64, 256), np.float32), None)]),
                          ["unexpected tensor 'blk.0.attn_qkv.weight'"]),
    "missing tensor": (dict(drop=("blk.1.ffn_down.weight",)), ["'blk.1.ffn_down.weight'", "missing"]),
}


@pytest.mark.parametrize("what", sorted(REFUSALS))
def test_a_refused_file_fails_before_any_tensor_is_read_or_hashed(what, spies, tmp_path, fields):
    kw, needles = REFUSALS[what]
    path = tiny_file(tmp_path, QT.Q8_0, fields, **dict({"tied": False}, **kw))
    with pytest.raises(LoaderError) as info:
        open_model(path, weights="native")
    for needle in [path, *needles]:
        assert needle in str(info.value), (needle, str(info.value))
    assert spies == [], f"read before refusing: {spies}"
    with pytest.raises(LoaderError):
        engine(path, "auto")
    assert spies == []


@pytest.mark.parametrize("type_id", [4, 99], ids=["retired-Q4_2", "unknown"])
def test_a_type_id_gguf_does_not_know_is_refused_naming_the_tensor(type_id, spies, tmp_path, fields):
    """A newer (or retired) GGML type id in the tensor table: refused as the header is parsed,
    naming the tensor, the id and what strata reads, before any tensor is read or hashed."""
    path = tiny_file(tmp_path, QT.Q8_0, fields, tied=False)
    writable = GGUFReader(path, "r+")
    target = next(t for t in writable.tensors if t.name == "blk.1.ffn_up.weight")
    target.field.parts[4][0] = type_id  # the tensor info's type id, in the file's memory map
    writable.data.flush()
    del writable, target
    with pytest.raises(LoaderError) as info:
        open_model(path, weights="auto")
    message = str(info.value)
    for needle in [path, "'blk.1.ffn_up.weight'", f"type id {type_id}", "supported: ", "Q4_K", "IQ4_XS"]:
        assert needle in message, (needle, message)
    assert spies == [], f"read before refusing: {spies}"


# with the kernels: only where this CPU has AVX2 (FUSED_ONLY); without them: everywhere, forced
@pytest.mark.parametrize("kernels", [True] * len(FUSED_ONLY) + [False], ids=["kernels"] * len(FUSED_ONLY) + ["no-kernels"])
def test_the_memory_guard_counts_what_each_weights_mode_holds(kernels, tmp_path, fields, monkeypatch):
    """native holds the file's blocks where the kernels run: the guard adds up the file's bytes,
    not a dense copy; auto holds both. Without the kernels (a CPU without AVX2, forced here)
    every mode loads dense, and the guard counts the dense copy only."""
    import os

    import strata.engine.build as build

    if kernels:
        require_quant_ops()
    else:
        monkeypatch.setattr(build, "load_quant_ops", lambda: None)
    path = tiny_file(tmp_path, QT.Q4_K, fields, tied=False)
    plans = {}
    monkeypatch.setattr(build, "check_memory", lambda plan, *a: plans.setdefault(len(plans), plan))
    engine(path, "native", "bfloat16")
    engine(path, "dense", "bfloat16")
    engine(path, "auto", "bfloat16")
    native, dense, auto = plans[0], plans[1], plans[2]
    if kernels:
        assert native.weight_bytes == os.path.getsize(path) < dense.weight_bytes
        assert auto.weight_bytes == dense.weight_bytes + os.path.getsize(path)  # the dense copy beside the blocks
    else:
        assert native.weight_bytes == dense.weight_bytes == auto.weight_bytes > os.path.getsize(path)
    assert native.kv_bytes == dense.kv_bytes == auto.kv_bytes


def test_the_memory_guard_counts_q5_0_as_the_form_auto_holds(tmp_path, fields, monkeypatch):
    """Under `--weights auto` in bf16 where strata's quantized kernels run, Q5_0 projections are
    held in the q5x8 form (Q5_0's own 22 bytes a block and column), but Q5_0 fused with Q8_0 (a
    q|k|v whose v is Q8_0, as llama.cpp's Q4_K_M writes them) in the q8x8 form (34 bytes): the
    guard counts exactly that widening, and the layers hold exactly what it counts."""
    import os

    import strata.engine.build as build

    require_quant_ops()
    v = ("blk.0.attn_v.weight", random_blocks(QT.Q8_0, 128, HIDDEN, np.random.default_rng(3), rms=0.08), QT.Q8_0)
    path = tiny_file(tmp_path, QT.Q5_0, fields, tied=False, odd=[v])
    plans = {}
    monkeypatch.setattr(build, "check_memory", lambda plan, *a: plans.setdefault(len(plans), plan))
    engine(path, "dense", "bfloat16")
    auto = engine(path, "auto", "bfloat16")
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    fused = sum(int(tensors[f"blk.0.attn_{p}.weight"].n_bytes) for p in "qk") // 22  # Q5_0 blocks beside the v
    assert plans[1].weight_bytes == plans[0].weight_bytes + os.path.getsize(path) + fused * 12
    forms = {(i, n): p.x8 for i, layer in enumerate(auto._model.layers)
             for n, p in zip(("qkv", "o", "gate_up", "down"), layer.fused.projections)}
    assert forms[0, "qkv"].weight_bits == 8 and forms[1, "qkv"].weight_bits == 5
    assert all(x8.weight_bits == 5 for (i, n), x8 in forms.items() if n != "qkv")
    blocks = sum(int(t.n_bytes) // (34 if t.tensor_type == QT.Q8_0 else 22) for t in tensors.values()
                 if t.name.startswith("blk.") and t.tensor_type in (QT.Q5_0, QT.Q8_0))
    assert sum(x8.num_bytes for x8 in forms.values()) == (blocks - fused - 128 * HIDDEN // 32) * 22 + (
        fused + 128 * HIDDEN // 32) * 34
