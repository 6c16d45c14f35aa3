"""Every engine flag, validated in one place before anything is allocated.

A bad value raises ConfigError whose message names the flag as a user types it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strata.errors import ConfigError
from strata.kv.residency import POLICIES
from strata.kv.ring_rule import DEFAULT_PAGE, DEFAULT_RING, RESIDENT_MIN, RingSizing, ring_adapt_enabled
from strata.kv.table import chunks_for
from strata.moe.evict import DEFAULT_EVICT
from strata.moe.options import MoEOptions

DTYPES = ("float32", "bfloat16")
KV_DTYPES = ("f32", "f16", "bf16", "int8")
DEFAULT_KV_CHUNK = 4096
DEFAULT_PREFILL_CHUNK = 256
DEFAULT_MEMORY_GUARD_MIB = 512
WEIGHT_FORMATS = ("auto", "dense", "native")
SPEC_MODES = ("ngram", "draft", "off")
QUANT_ISA_ENV = "STRATA_QUANT_ISA"
QUANT_ISAS = ("auto", "avx2", "avx_vnni", "avx512_vnni")  # the quantized kernels' variants (strata/csrc/quant_*.cpp)
Q4_KERNEL_ENV = "STRATA_Q4_KERNEL"
Q4_KERNELS = ("auto", "x8", "x8-int8", "int4")  # how --weights auto reads Q4_0/Q4_1 at bfloat16 decode rows (models/linear.py)
HEAD_KERNEL_ENV = "STRATA_HEAD_KERNEL"
HEAD_KERNELS = ("auto", "int8", "quant", "x8")  # how --weights auto reads the LM head at bfloat16 decode rows (models/head.py)
DENSE_GEMM_ENV = "STRATA_DENSE_GEMM"
DENSE_GEMMS = ("auto", "amx", "onednn")  # which GEMM reads packed bfloat16 weights on the CPU (models/packed.py)
PROMPT_ATTENTION_ENV = "STRATA_PROMPT_ATTENTION"
PROMPT_ATTENTIONS = ("auto", "amx", "sdpa")  # what reads a long bfloat16 prompt piece's cells (runner/inputs.py)
ATTENTION_ISA_ENV = "STRATA_ATTENTION_ISA"
ATTENTION_ISAS = ("auto", "avx2", "avx512", "avx512_bf16")  # the fused decode attention's variants (strata/csrc/attention_*.cpp)
DEFAULT_SPEC_K = 3  # up to 4 rows a verify step; the adaptive count (drafting/adaptive.py) proposes fewer where they do not pay


@dataclass(frozen=True)
class EngineConfig:
    """What the engine was asked for. `max_context=None` means the model's trained length."""

    model: str | None = None
    dtype: str = "bfloat16"
    kv: str | None = None  # None: the 16-bit twin of --dtype (f32 for float32)
    weights: str = "auto"
    max_context: int | None = None
    batch: int = 0
    kv_chunk: int = DEFAULT_KV_CHUNK
    kv_pool_tokens: int | None = None
    # Idle conversations whose windows each windowed layer group holds besides every lane's
    # (kv/groups.py; None: one per lane); more give way, least recently used first
    kv_window_keep: int | None = None
    # With --kv-pool-tokens: sliding-window layers in their own groups, holding only their windows
    kv_window_groups: bool = True
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    prefill_alone: int | None = None  # prompt tokens per step when no lane decodes (None: prefill_chunk)
    devices: tuple[str, ...] = ("cpu",)
    threads: int | None = None
    memory_guard_mib: int = DEFAULT_MEMORY_GUARD_MIB
    kv_resident: int | None = None  # cells per layer each lane keeps on the device (None: no ring)
    kv_page: int | None = None  # None: DEFAULT_PAGE, or the chunk when the chunk is smaller
    kv_evict: str = "clock"
    kv_ring_default: int = DEFAULT_RING
    kv_ring_budget: int | None = None  # device cells per layer for every ring together (None: lanes x cap)
    kv_ring_adapt: bool | None = None  # None: from STRATA_KV_RING_ADAPT
    fused: bool | None = None  # the fused CPU decode ops where they apply; None: from STRATA_FUSED
    spec: str = "ngram"  # speculative decoding: "ngram" (prompt lookup), "draft" (--draft-model), "off"
    spec_k: int = DEFAULT_SPEC_K  # drafts a lane proposes a step, at most (adaptive below it)
    draft_model: str | None = None
    moe_resident: int | None = None  # expert slots per MoE layer on the compute device (None: every expert)
    moe_evict: str = DEFAULT_EVICT
    moe_prefetch: bool = False
    device_memory: int | None = None  # MiB: one budget for resident weights, expert slots and rings
    moe_resident_min: int | None = None  # with device_memory: the fewest slots per layer (None: experts per token)

    def __post_init__(self) -> None:
        if isinstance(self.devices, str):  # "cpu,cpu" as typed on the command line
            object.__setattr__(self, "devices", parse_devices(self.devices))
        elif isinstance(self.devices, list):
            object.__setattr__(self, "devices", tuple(self.devices))
        if self.kv_ring_adapt is None:
            object.__setattr__(self, "kv_ring_adapt", ring_adapt_enabled(os.environ))
        if self.fused is None:
            object.__setattr__(self, "fused", fused_enabled(os.environ))
        validate(self)

    @property
    def num_lanes(self) -> int:
        """The main session (lane 0) plus `--batch` slots."""
        return 1 + self.batch

    @property
    def kv_dtype(self) -> str:
        if self.kv is not None:
            return self.kv
        return "f32" if self.dtype == "float32" else "bf16"

    @property
    def is_pooled(self) -> bool:
        return self.kv_pool_tokens is not None

    @property
    def page(self) -> int:
        return self.kv_page if self.kv_page is not None else min(DEFAULT_PAGE, self.kv_chunk)

    @property
    def ring_sizing(self) -> RingSizing | None:
        if self.kv_resident is None:
            return None
        return RingSizing(self.kv_resident, self.page, self.kv_ring_default, bool(self.kv_ring_adapt))

    @property
    def ring_budget(self) -> int:
        """Device cells per layer shared by every lane's ring."""
        if self.kv_ring_budget is not None:
            return self.kv_ring_budget
        return self.num_lanes * self.ring_sizing.cap_cells

    @property
    def moe(self) -> MoEOptions:
        return MoEOptions(self.moe_resident, self.moe_evict, self.moe_prefetch, self.device_memory,
                          self.moe_resident_min)

    def replace(self, **changes) -> EngineConfig:
        return dataclasses.replace(self, **changes)


FUSED_ENV = "STRATA_FUSED"
CACHE_ENV = "STRATA_CACHE_DIR"
HEAP_TRIM_ENV = "STRATA_HEAP_TRIM"
DEFAULT_HEAP_TRIM_S = None  # off unless asked: no soak has measured a gain (docs/browser.md)


def heap_trim_seconds(environ: Mapping[str, str] | None = None) -> float | None:
    """`STRATA_HEAP_TRIM`: seconds between two trims of the C heap (glibc malloc_trim) by the
    server's engine thread between steps; 0, off or false: never; unset or empty: the default."""
    environ = os.environ if environ is None else environ
    value = environ.get(HEAP_TRIM_ENV, "").strip().lower()
    if value == "":
        return DEFAULT_HEAP_TRIM_S
    if value in ("0", "off", "false"):
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise ConfigError(f"${HEAP_TRIM_ENV} must be a number of seconds > 0, or 0/off, got {environ[HEAP_TRIM_ENV]!r}")
    return seconds


def fused_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """`STRATA_FUSED`: unset, empty, 1, true or on use the fused CPU decode ops (strata/csrc) where
    they apply; 0, false or off use torch's ops; any other value is an error."""
    environ = os.environ if environ is None else environ
    value = environ.get(FUSED_ENV, "").strip().lower()
    if value in ("", "1", "true", "on"):
        return True
    if value in ("0", "false", "off"):
        return False
    raise ConfigError(f"${FUSED_ENV} must be 1/true/on or 0/false/off, got {environ[FUSED_ENV]!r}")


def choice_from_env(name: str, choices: Sequence[str], environ: Mapping[str, str] | None = None) -> str:
    """`$name` lower-cased, one of `choices`; unset or empty: "auto" (every such variable's
    first choice); anything else is a ConfigError naming the variable."""
    environ = os.environ if environ is None else environ
    value = environ.get(name, "").strip().lower() or "auto"
    if value not in choices:
        raise ConfigError(f"${name} must be one of {', '.join(choices)}, got {environ[name]!r}")
    return value


def quant_isa_from_env(environ: Mapping[str, str] | None = None) -> str:
    """`$STRATA_QUANT_ISA`: the instruction set the quantized-weight kernels run. Unset, empty
    or `auto`: the best this CPU has (AVX-512 VNNI, else AVX-VNNI, else AVX2); `avx2` forces the
    AVX2 path (tests run every variant the CPU has on one machine); anything else is an error."""
    return choice_from_env(QUANT_ISA_ENV, QUANT_ISAS, environ)


def q4_kernel_from_env(environ: Mapping[str, str] | None = None) -> str:
    """`$STRATA_Q4_KERNEL`: which kernel `--weights auto` reads Q4_0/Q4_1 projections with at
    bfloat16 decode rows. Unset, empty, `auto` or `x8`: strata's x8 kernel with 15-bit
    activations (models/q4x8.py); `x8-int8`: the same with 8-bit activations (faster at 4 and
    more rows, but outside tests/model/test_serving_accuracy.py's bound on the mean logit
    difference on the default model); `int4`: torch's int4 kernel (bfloat16 activations);
    anything else is an error."""
    return choice_from_env(Q4_KERNEL_ENV, Q4_KERNELS, environ)


def dense_gemm_from_env(environ: Mapping[str, str] | None = None) -> str:
    """`$STRATA_DENSE_GEMM`: which GEMM reads the bfloat16 dense weights held in a GEMM's layout
    (models/packed.py). Unset, empty or `auto`: strata's AMX kernel where the CPU has AMX-BF16,
    else oneDNN's; `onednn`: oneDNN's everywhere; `amx`: strata's (an error where it cannot
    run); anything else is an error."""
    return choice_from_env(DENSE_GEMM_ENV, DENSE_GEMMS, environ)


def prompt_attention_from_env(environ: Mapping[str, str] | None = None) -> str:
    """`$STRATA_PROMPT_ATTENTION`: what reads a bfloat16 prompt piece too long for the decode
    kernel (runner/inputs.py). Unset, empty or `auto`: strata's AMX kernel where the CPU has
    AMX-BF16, else SDPA; `sdpa`: SDPA everywhere; `amx`: strata's (an error where it cannot
    run); anything else is an error."""
    return choice_from_env(PROMPT_ATTENTION_ENV, PROMPT_ATTENTIONS, environ)


def head_kernel_from_env(environ: Mapping[str, str] | None = None) -> str:
    """`$STRATA_HEAD_KERNEL`: how `--weights auto` reads the LM head at bfloat16 decode rows.
    Unset, empty or `auto`: the file's quantized head in place with strata's kernel where
    torch's CPU kernels run their AVX2 path (no AVX-512), a Q8_0 head's q8x8 form with strata's
    x8 kernel where that runs AVX-512 VNNI, else torch's int8 kernel on a per-row int8 copy;
    `int8`, `quant` or `x8` forces one (`quant` needs a head the kernels read, `x8` a Q8_0
    head: else int8); anything else is an error."""
    return choice_from_env(HEAD_KERNEL_ENV, HEAD_KERNELS, environ)


def attention_isa_from_env(environ: Mapping[str, str] | None = None) -> str:
    """`$STRATA_ATTENTION_ISA`: the instruction set the fused decode attention runs. Unset,
    empty or `auto`: the best this CPU has (AVX-512 BF16, else AVX-512, else AVX2); `avx2` or
    `avx512` forces that path; anything else is an error."""
    return choice_from_env(ATTENTION_ISA_ENV, ATTENTION_ISAS, environ)


def prepared_cache_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """Where the prepared-model cache lives: `$STRATA_CACHE_DIR` (off, 0, false or empty: no
    cache), else `$XDG_CACHE_HOME/strata`, else ~/.cache/strata."""
    environ = os.environ if environ is None else environ
    value = environ.get(CACHE_ENV)
    if value is not None:
        return None if value.strip().lower() in ("off", "0", "false", "") else value
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "strata")


def _positive_int(value, flag: str, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{flag} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{flag} must be at least {minimum}, got {value}")


def _choice(value, flag: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")


def validate(cfg: EngineConfig) -> None:
    _choice(cfg.dtype, "--dtype", DTYPES)
    if cfg.kv is not None:
        _choice(cfg.kv, "--kv", KV_DTYPES)
    _choice(cfg.weights, "--weights", WEIGHT_FORMATS)
    if cfg.max_context is not None:
        _positive_int(cfg.max_context, "--max-context", minimum=2)
    _positive_int(cfg.batch, "--batch", minimum=0)
    _positive_int(cfg.kv_chunk, "--kv-chunk")
    _positive_int(cfg.prefill_chunk, "--prefill-chunk")
    if cfg.prefill_alone is not None:
        _positive_int(cfg.prefill_alone, "--prefill-alone")
    _positive_int(cfg.memory_guard_mib, "--memory-guard-mib", minimum=0)
    if cfg.threads is not None:
        _positive_int(cfg.threads, "--threads")
    if not cfg.devices:
        raise ConfigError("--devices must name at least one device, e.g. cpu or cuda:0")
    for dev in cfg.devices:
        if not isinstance(dev, str) or not (dev == "cpu" or dev.startswith("cuda") or dev == "mps"):
            raise ConfigError(f"--devices: unknown device {dev!r} (use cpu, cuda or cuda:N)")
    _validate_ring(cfg)
    cfg.moe  # the expert cache's and the device budget's flags (moe/options.py)
    if cfg.device_memory is not None and cfg.kv_ring_budget is not None:
        raise ConfigError("--kv-ring-budget and --device-memory both size the rings: give one (--device-memory "
                          "splits one budget between rings and expert slots)")
    _choice(cfg.spec, "--spec", SPEC_MODES)
    _positive_int(cfg.spec_k, "--spec-k")
    if cfg.spec == "draft" and cfg.draft_model is None:
        raise ConfigError("--spec draft needs --draft-model PATH (a smaller model with the same tokenizer)")
    if cfg.draft_model is not None and cfg.spec != "draft":
        raise ConfigError("--draft-model is used only with --spec draft")
    if not isinstance(cfg.kv_window_groups, bool):
        raise ConfigError(f"--kv-window-groups must be on or off, got {cfg.kv_window_groups!r}")
    if cfg.kv_window_keep is not None:
        _positive_int(cfg.kv_window_keep, "--kv-window-keep", minimum=0)
    if cfg.kv_pool_tokens is not None:
        _positive_int(cfg.kv_pool_tokens, "--kv-pool-tokens")
        if cfg.max_context is not None:
            check_pool_covers_context(cfg.kv_pool_tokens, cfg.max_context, cfg.kv_chunk)


def _validate_ring(cfg: EngineConfig) -> None:
    _choice(cfg.kv_evict, "--kv-evict", POLICIES)
    _positive_int(cfg.kv_ring_default, "--kv-ring-default")
    if cfg.kv_page is not None:
        _positive_int(cfg.kv_page, "--kv-page", minimum=RESIDENT_MIN)
    if cfg.kv_chunk % cfg.page:
        raise ConfigError(f"--kv-page {cfg.page} must divide --kv-chunk {cfg.kv_chunk}")
    if cfg.kv_resident is None:
        if cfg.kv_ring_budget is not None:
            raise ConfigError("--kv-ring-budget needs --kv-resident")
        return
    if isinstance(cfg.kv_resident, bool) or not isinstance(cfg.kv_resident, int):
        raise ConfigError(f"--kv-resident must be an integer, got {cfg.kv_resident!r}")
    if cfg.kv_resident <= 0:
        raise ConfigError(f"--kv-resident must be positive (cells per layer on the device), got {cfg.kv_resident}")
    _positive_int(cfg.kv_resident, "--kv-resident", minimum=RESIDENT_MIN)
    if cfg.kv_ring_budget is not None:
        _positive_int(cfg.kv_ring_budget, "--kv-ring-budget", minimum=cfg.page)


def check_pool_covers_context(kv_pool_tokens: int, max_context: int, kv_chunk: int) -> None:
    smallest = chunks_for(max_context, kv_chunk) * kv_chunk
    if kv_pool_tokens // kv_chunk * kv_chunk < smallest:
        raise ConfigError(
            f"--kv-pool-tokens {kv_pool_tokens} cannot hold one --max-context {max_context} "
            f"conversation in chunks of --kv-chunk {kv_chunk}: the smallest valid value is {smallest}"
        )


def parse_devices(text: str) -> tuple[str, ...]:
    devices = tuple(d.strip() for d in text.split(",") if d.strip())
    if not devices:
        raise ConfigError(f"--devices must name at least one device, got {text!r}")
    return devices

