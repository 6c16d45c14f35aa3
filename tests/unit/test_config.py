"""EngineConfig: every bad value is a ConfigError naming the flag; the memory guard's refusal."""

from __future__ import annotations

import dataclasses

import pytest

from strata.config import (
    DEFAULT_KV_CHUNK,
    DEFAULT_MEMORY_GUARD_MIB,
    DEFAULT_PREFILL_CHUNK,
    EngineConfig,
    check_pool_covers_context,
    chunks_for,
    parse_devices,
)
from strata.engine.memory import MIB, MemoryPlan, check_memory
from strata.errors import ConfigError

# (field, bad value, flag the message must name, more text it must hold)
BAD_VALUES = [
    ("dtype", "float8", "--dtype", "'float8'"),
    ("dtype", "float16", "--dtype", "float32, bfloat16"),
    ("dtype", None, "--dtype", "None"),
    ("kv", "int4", "--kv", "'int4'"),
    ("kv", "fp8", "--kv", "f32, f16, bf16"),
    ("weights", "fp4", "--weights", "auto, dense, native"),
    ("max_context", 1, "--max-context", "at least 2"),
    ("max_context", 0, "--max-context", "at least 2"),
    ("max_context", -5, "--max-context", "-5"),
    ("max_context", 1024.0, "--max-context", "integer"),
    ("max_context", "1024", "--max-context", "integer"),
    ("max_context", True, "--max-context", "integer"),
    ("batch", -1, "--batch", "at least 0"),
    ("batch", 1.5, "--batch", "integer"),
    ("batch", True, "--batch", "integer"),
    ("batch", False, "--batch", "integer"),
    ("kv_chunk", 0, "--kv-chunk", "at least 1"),
    ("kv_chunk", -4096, "--kv-chunk", "at least 1"),
    ("kv_chunk", 16.0, "--kv-chunk", "integer"),
    ("kv_chunk", True, "--kv-chunk", "integer"),
    ("kv_chunk", None, "--kv-chunk", "integer"),
    ("kv_pool_tokens", 0, "--kv-pool-tokens", "at least 1"),
    ("kv_pool_tokens", -1, "--kv-pool-tokens", "at least 1"),
    ("kv_pool_tokens", True, "--kv-pool-tokens", "integer"),
    ("kv_pool_tokens", "8192", "--kv-pool-tokens", "integer"),
    ("prefill_chunk", 0, "--prefill-chunk", "at least 1"),
    ("prefill_chunk", True, "--prefill-chunk", "integer"),
    ("prefill_alone", 0, "--prefill-alone", "at least 1"),
    ("threads", 0, "--threads", "at least 1"),
    ("threads", True, "--threads", "integer"),
    ("threads", 2.0, "--threads", "integer"),
    ("memory_guard_mib", -1, "--memory-guard-mib", "at least 0"),
    ("memory_guard_mib", True, "--memory-guard-mib", "integer"),
    ("devices", (), "--devices", "at least one device"),
    ("devices", ("tpu",), "--devices", "'tpu'"),
    ("devices", ("cpu", "gpu0"), "--devices", "'gpu0'"),
    ("devices", ("cpu", 0), "--devices", "0"),
]


@pytest.mark.parametrize("field,value,flag,text", BAD_VALUES,
                         ids=[f"{f}={v!r}" for f, v, _, _ in BAD_VALUES])
def test_bad_value_names_the_flag(field, value, flag, text):
    with pytest.raises(ConfigError) as info:
        EngineConfig(**{field: value})
    message = str(info.value)
    assert flag in message and text in message, message


@pytest.mark.parametrize("field,value,flag,text", BAD_VALUES[:6] + BAD_VALUES[12:14],
                         ids=[f"{f}={v!r}" for f, v, _, _ in BAD_VALUES[:6] + BAD_VALUES[12:14]])
def test_replace_validates_too(field, value, flag, text):
    with pytest.raises(ConfigError, match=flag):
        EngineConfig().replace(**{field: value})


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError):
        EngineConfig(kv_chunk=0)


@pytest.mark.parametrize("pool,context,chunk,smallest", [
    (100, 1024, 256, 1024),
    (1023, 1024, 256, 1024),
    (1279, 1025, 256, 1280),  # 1279 cells hold only 4 whole chunks; 1025 cells need 5
    (4095, 1, 4096, 4096),
    (15, 16, 16, 16),
])
def test_pool_too_small_gives_the_smallest_valid_value(pool, context, chunk, smallest):
    with pytest.raises(ConfigError) as info:
        EngineConfig(kv_pool_tokens=pool, max_context=max(context, 2), kv_chunk=chunk)
    message = str(info.value)
    assert f"--kv-pool-tokens {pool}" in message
    assert f"--max-context {max(context, 2)}" in message and f"--kv-chunk {chunk}" in message
    assert message.endswith(f"the smallest valid value is {smallest}"), message
    EngineConfig(kv_pool_tokens=smallest, max_context=max(context, 2), kv_chunk=chunk)  # the value given works


@pytest.mark.parametrize("context,chunk", [(2, 1), (1000, 7), (4096, 4096), (4097, 4096), (131072, 4096)])
def test_smallest_pool_is_exactly_the_boundary(context, chunk):
    smallest = chunks_for(context, chunk) * chunk
    check_pool_covers_context(smallest, context, chunk)
    check_pool_covers_context(smallest + chunk - 1, context, chunk)
    with pytest.raises(ConfigError, match=f"smallest valid value is {smallest}"):
        check_pool_covers_context(smallest - 1, context, chunk)


def test_pool_without_max_context_is_checked_later():
    """The model's trained length is unknown here; the engine checks once it has read it."""
    assert EngineConfig(kv_pool_tokens=16, kv_chunk=16).is_pooled


def test_defaults():
    cfg = EngineConfig()
    assert cfg.model is None and cfg.max_context is None and cfg.kv_pool_tokens is None
    assert cfg.dtype == "bfloat16" and cfg.weights == "auto" and cfg.kv is None
    assert cfg.batch == 0 and cfg.num_lanes == 1
    assert cfg.kv_chunk == DEFAULT_KV_CHUNK == 4096
    assert cfg.prefill_chunk == DEFAULT_PREFILL_CHUNK
    assert cfg.memory_guard_mib == DEFAULT_MEMORY_GUARD_MIB
    assert cfg.devices == ("cpu",) and cfg.threads is None
    assert not cfg.is_pooled


@pytest.mark.parametrize("batch", [0, 1, 7, 64])
def test_num_lanes_is_the_main_session_plus_batch_slots(batch):
    assert EngineConfig(batch=batch).num_lanes == batch + 1


@pytest.mark.parametrize("dtype,kv,expected", [
    ("bfloat16", None, "bf16"),
    ("float32", None, "f32"),
    ("bfloat16", "f32", "f32"),
    ("float32", "f16", "f16"),
    ("float32", "bf16", "bf16"),
])
def test_kv_dtype_follows_dtype_unless_set(dtype, kv, expected):
    assert EngineConfig(dtype=dtype, kv=kv).kv_dtype == expected


def test_good_values_pass():
    cfg = EngineConfig(model="m.gguf", dtype="float32", kv="f16", weights="native", max_context=2, batch=3,
                       kv_chunk=1, kv_pool_tokens=8, prefill_chunk=1, devices=("cpu", "cuda:1", "mps"),
                       threads=1, memory_guard_mib=0)
    assert cfg.is_pooled and cfg.num_lanes == 4


def test_config_is_frozen():
    cfg = EngineConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.kv_chunk = 0  # type: ignore[misc]
    assert cfg.replace(kv_chunk=16).kv_chunk == 16 and cfg.kv_chunk == DEFAULT_KV_CHUNK


@pytest.mark.parametrize("text,expected", [
    ("cpu", ("cpu",)), ("cpu,cpu", ("cpu", "cpu")), (" cuda:0 , cuda:1 ", ("cuda:0", "cuda:1")),
])
def test_parse_devices(text, expected):
    assert parse_devices(text) == expected


@pytest.mark.parametrize("text", ["", ",", " , "])
def test_parse_devices_refuses_nothing(text):
    with pytest.raises(ConfigError, match="--devices"):
        parse_devices(text)


# ---- the memory guard ------------------------------------------------------------------------


def test_memory_guard_accepts_exactly_the_guard_left_and_refuses_one_byte_less():
    plan = MemoryPlan(weight_bytes=100 * MIB, kv_bytes=200 * MIB)  # 300 MiB held
    assert check_memory(plan, guard_mib=512, is_pooled=False, available=812 * MIB) is None  # 512 MiB left
    assert check_memory(plan, guard_mib=0, is_pooled=True, available=300 * MIB) is None  # nothing left, no guard
    with pytest.raises(ConfigError, match="--memory-guard-mib 512"):
        check_memory(plan, guard_mib=512, is_pooled=False, available=812 * MIB - 1)
    with pytest.raises(ConfigError, match="--memory-guard-mib 0"):
        check_memory(plan, guard_mib=0, is_pooled=True, available=300 * MIB - 1)


@pytest.mark.parametrize("is_pooled,flags", [
    (False, ["--max-context", "--batch", "--kv-pool-tokens", "--kv", "--dtype"]),
    (True, ["--kv-pool-tokens", "--kv", "--dtype"]),
])
def test_memory_guard_refuses_naming_the_flags_to_lower(is_pooled, flags):
    plan = MemoryPlan(weight_bytes=100 * MIB, kv_bytes=2048 * MIB)
    with pytest.raises(ConfigError) as info:
        check_memory(plan, guard_mib=512, is_pooled=is_pooled, available=2659 * MIB)  # 1 MiB short
    message = str(info.value)
    for flag in flags + ["--memory-guard-mib 512"]:
        assert flag in message, message
    assert "weights 100 MiB" in message and "K/V 2048 MiB" in message
    assert "of 2659 MiB available" in message and "would leave 511 MiB" in message
    if is_pooled:
        assert "--max-context" not in message and "--batch" not in message


def test_memory_guard_refuses_when_the_plan_exceeds_memory():
    plan = MemoryPlan(weight_bytes=300 * MIB, kv_bytes=8192 * MIB)
    assert plan.total_bytes == 8492 * MIB
    with pytest.raises(ConfigError, match="would leave -7468 MiB of 1024 MiB available"):
        check_memory(plan, guard_mib=0, is_pooled=False, available=1024 * MIB)


@pytest.mark.parametrize(("kwargs", "flag"), [({"spec": "medusa"}, "--spec"), ({"spec_k": 0}, "--spec-k"),
                                              ({"spec": "draft"}, "--draft-model"),
                                              ({"draft_model": "x.gguf"}, "--draft-model")])
def test_spec_flags_are_checked(kwargs, flag):
    with pytest.raises(ConfigError, match=flag):
        EngineConfig(**kwargs)


def test_heap_trim_seconds():
    from strata.config import DEFAULT_HEAP_TRIM_S, heap_trim_seconds

    assert heap_trim_seconds({}) == DEFAULT_HEAP_TRIM_S
    assert heap_trim_seconds({"STRATA_HEAP_TRIM": "2.5"}) == 2.5
    for off in ("0", "off", "false"):
        assert heap_trim_seconds({"STRATA_HEAP_TRIM": off}) is None
    for bad in ("-1", "soon", "nan", "inf"):
        with pytest.raises(ConfigError, match="STRATA_HEAP_TRIM"):
            heap_trim_seconds({"STRATA_HEAP_TRIM": bad})
