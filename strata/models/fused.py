"""The fused CPU decode ops (strata/csrc/decode_ops.cpp), when built and usable here, and the
quantized-weight kernels in the same module (strata/csrc/quant_ops.cpp).

`make venv` builds them at install time (setup.py) for x86-64 CPUs with AVX2 and FMA, with
AVX-512 variants of the decode attention and the quantized kernels chosen at run time where
cpuid has them (`$STRATA_ATTENTION_ISA`, `$STRATA_QUANT_ISA` force one; `kernel_paths` says
which run). They are used only where every condition holds: the module imported, this CPU has AVX2 (torch
says so), and the engine's `fused` setting is on
(`STRATA_FUSED`, read in strata/config.py). Elsewhere (another CPU, no compiler at
install, an accelerator) the model runs the equivalent torch ops; tests compare the two.
"""

from __future__ import annotations

import logging
from types import ModuleType

import torch

from strata.config import (ATTENTION_ISA_ENV, QUANT_ISA_ENV, attention_isa_from_env, fused_enabled,
                           quant_isa_from_env)
from strata.errors import ConfigError

log = logging.getLogger("strata")


def load_decode_ops(enabled: bool | None = None) -> ModuleType | None:
    """The extension module, or None where it must not or cannot be used. `enabled`: the
    engine's `fused` setting (None: `STRATA_FUSED`, read by strata/config.py)."""
    if not (fused_enabled() if enabled is None else enabled):
        return None
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return None
    try:
        from strata import _decode_ops  # built by setup.py
    except ImportError as exc:
        log.info("fused decode ops not built (%s): using torch ops", exc)
        return None
    isa = attention_isa_from_env()
    if not hasattr(_decode_ops, "set_attention_isa"):  # a build from before the AVX-512 variant
        return _decode_ops
    if isa != "auto" and isa not in _decode_ops.attention_isas():
        raise ConfigError(f"${ATTENTION_ISA_ENV}={isa}: this CPU runs only {', '.join(_decode_ops.attention_isas())}")
    _decode_ops.set_attention_isa(isa)
    return _decode_ops


def load_quant_ops() -> ModuleType | None:
    """The extension module for its quantized-weight kernels (`quant_matmul`, ...), with the
    instruction set `$STRATA_QUANT_ISA` asks for; None where it is not built or this CPU lacks
    AVX2. `STRATA_FUSED` does not turn these off: they hold weights no torch op reads."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return None
    try:
        from strata import _decode_ops
    except ImportError:
        return None
    isa = quant_isa_from_env()
    if isa != "auto" and isa not in _decode_ops.quant_isas():
        raise ConfigError(f"${QUANT_ISA_ENV}={isa}: this CPU runs only {', '.join(_decode_ops.quant_isas())}")
    _decode_ops.set_quant_isa(isa)
    return _decode_ops


def kernel_paths(ops: ModuleType | None, weight_forms: dict[str, int] | None = None) -> dict[str, object]:
    """Which instruction sets the kernels run in this process, for `strata generate --json` and
    the benchmarks: torch's own CPU capability (its GEMMs and int4/int8 weight kernels), AMX,
    the fused decode attention's variant and the quantized kernels' (None: not in use). `ops`:
    the model's fused ops (None: torch ops); `weight_forms`: LlamaModel.weight_forms."""
    quant = load_quant_ops()
    paths: dict[str, object] = {
        "torch_cpu": torch.backends.cpu.get_cpu_capability(),
        "amx": bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()),
        "attention": ops.attention_isa() if ops is not None and hasattr(ops, "attention_isa") else None,
        "quant": quant.quant_isa() if quant is not None else None,
    }
    if weight_forms is not None:
        paths["projections"] = weight_forms
        if not {"quant", "x8"} & set(weight_forms) and weight_forms.get("head") not in ("quant", "x8"):
            paths["quant"] = None  # built, but no weight of this model reads it
    return paths
