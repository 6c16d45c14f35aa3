"""The prepared-model cache: a second start maps the built model back instead of rebuilding it.

Each test has its own cache directory. The entry must give back the same model (every
tensor equal, the same greedy tokens in float32), never a stale one (a changed file or
build is a new key) and never a broken one (a damaged entry is rebuilt).
"""

from __future__ import annotations

import logging
import os
import resource
import signal

import pytest
import torch

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.loader import prepared
from strata.sampling import SamplingParams
from tests.conftest import require_default_model


@pytest.fixture
def cache(tmp_path, monkeypatch) -> str:
    folder = str(tmp_path / "cache")
    monkeypatch.setenv(prepared.CACHE_ENV, folder)
    return folder


def engine(**kw) -> Engine:
    cfg = dict(dtype="float32", weights="auto", max_context=192, kv_chunk=32)
    cfg.update(kw)
    return Engine(EngineConfig(**cfg), progress=False)


def greedy(e: Engine, n: int = 24) -> list[int]:
    e.submit("Write one sentence about the sea.", SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    return [t for out in e.run_until_done() for t in out.new_token_ids]


def tensors(model) -> list[torch.Tensor]:
    """Every tensor the model holds: dense weights and the file's quantized blocks alike."""
    def quant(q) -> list[torch.Tensor]:
        return [] if q is None else [p.raw for p in getattr(q, "parts", [q])]

    out = [t for t in (model.embedding.weight, model.norm.weight, model.lm_head.weight) if t is not None]
    out += quant(model.embedding.quant) + quant(getattr(model.lm_head, "quant", None))
    for layer in model.layers:
        for lin in (layer.qkv, layer.o, layer.gate_up, layer.down):
            out += [t for t in (lin.weight, lin.bias) if t is not None] + quant(lin.quant)
        out += [layer.input_norm.weight, layer.post_norm.weight]
    return out


def test_the_second_start_maps_the_same_model_from_the_cache(cache):
    require_default_model()
    first = engine()
    assert not first.info.loaded_from_cache and len(os.listdir(cache)) == 1
    second = engine(max_context=160)  # another --max-context shares the entry (rotary rebuilt)
    assert second.info.loaded_from_cache
    assert second._model.rotary[torch.device("cpu")].cos.shape[0] == 160
    a, b = tensors(first._model), tensors(second._model)
    assert len(a) == len(b) > 180 and all(torch.equal(x, y) for x, y in zip(a, b))
    assert second.tokenizer.encode("Hello, sea!") == first.tokenizer.encode("Hello, sea!")
    assert second.tokenizer.chat_template == first.tokenizer.chat_template
    assert second.info.fingerprint == first.info.fingerprint and second.model_config == first.model_config
    assert greedy(second) == greedy(first)


def test_native_weights_map_back_from_the_cache(cache):
    """The file's blocks pickle (QuantWeight) and come back read in place, same tokens."""
    require_default_model()
    first = engine(weights="native")
    second = engine(weights="native")
    assert not first.info.loaded_from_cache and second.info.loaded_from_cache
    a, b = tensors(first._model), tensors(second._model)
    assert any(t.dtype == torch.uint8 for t in b) and all(torch.equal(x, y) for x, y in zip(a, b))
    assert second._model.layers[0].qkv.weight is None and second._model.layers[0].qkv.quant is not None
    assert greedy(second) == greedy(first)


def test_another_build_is_another_entry(cache):
    require_default_model()
    engine()
    e = engine(weights="dense")
    assert not e.info.loaded_from_cache and len(os.listdir(cache)) == 2


def test_a_damaged_entry_is_rebuilt(cache, caplog):
    require_default_model()
    engine()
    (name,) = os.listdir(cache)
    with open(os.path.join(cache, name), "r+b") as f:
        f.truncate(1000)
    with caplog.at_level(logging.WARNING, logger="strata.loader"):
        e = engine()
    assert not e.info.loaded_from_cache and "unreadable" in caplog.text
    assert engine().info.loaded_from_cache  # the rebuilt entry is whole again


def test_a_full_disk_leaves_no_entry_and_the_model_loads(cache, caplog):
    """Writes past 1 MiB fail (RLIMIT_FSIZE, as a full disk does): a warning, no file, same tokens."""
    require_default_model()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
        with caplog.at_level(logging.WARNING, logger="strata.loader"):
            e = engine()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert not e.info.loaded_from_cache and "could not write the prepared-model cache" in caplog.text
    assert os.listdir(cache) == []  # the partial entry is gone
    assert greedy(e) == greedy(engine())


def test_keys_follow_the_file_and_the_build(cache, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 100)
    key = prepared.cache_key(str(model), "bfloat16", "auto", ("cpu",))
    assert key == prepared.cache_key(str(model), "bfloat16", "auto", ("cpu",))
    others = {prepared.cache_key(str(model), *args) for args in [
        ("float32", "auto", ("cpu",)), ("bfloat16", "dense", ("cpu",)), ("bfloat16", "auto", ("cpu", "cpu"))]}
    assert key not in others and len(others) == 3
    st = os.stat(model)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # the file was rewritten
    assert prepared.cache_key(str(model), "bfloat16", "auto", ("cpu",)) != key
    assert prepared.cache_key(str(model), "bfloat16", "auto", ("cuda:0",)) is None  # CPU builds only


def test_keys_follow_the_quantized_kernels_instruction_set(cache, tmp_path, monkeypatch):
    """--weights auto chooses forms by the kernels' instruction set (q8x8 for Q5_0/Q8_0 on
    AVX-512 VNNI only): an entry built under one must not be mapped under another."""
    from strata.config import QUANT_ISA_ENV
    from strata.models.fused import load_quant_ops

    ops = load_quant_ops()
    if ops is None or len(ops.quant_isas()) < 2:
        pytest.skip("one quantized-kernel instruction set on this CPU")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 100)
    keys = set()
    for isa in ops.quant_isas():
        monkeypatch.setenv(QUANT_ISA_ENV, isa)
        keys.add(prepared.cache_key(str(model), "bfloat16", "auto", ("cpu",)))
    monkeypatch.delenv(QUANT_ISA_ENV)
    load_quant_ops()  # the process's own choice again, for the tests after this one
    assert len(keys) == len(ops.quant_isas())
    assert prepared.cache_key(str(tmp_path), "bfloat16", "auto", ("cpu",)) is None  # a HF directory


@pytest.mark.parametrize("value", ["off", "0", "false", ""])
def test_the_cache_can_be_turned_off(monkeypatch, tmp_path, value):
    monkeypatch.setenv(prepared.CACHE_ENV, value)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    assert prepared.cache_dir() is None and prepared.cache_key(str(model), "bfloat16", "auto", ("cpu",)) is None


def test_the_cache_keeps_the_entries_used_last(cache):
    os.makedirs(cache)
    for i in range(prepared.MAX_ENTRIES + 2):
        path = os.path.join(cache, f"old{i}.pt")
        open(path, "wb").close()
        os.utime(path, (1000 + i, 1000 + i))
    prepared.trim(cache)
    kept = sorted(os.listdir(cache))
    assert kept == sorted(f"old{i}.pt" for i in range(2, prepared.MAX_ENTRIES + 2))
