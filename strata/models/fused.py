"""The fused CPU decode ops (strata/csrc/decode_ops.cpp), when built and usable here, and the
quantized-weight kernels in the same module (strata/csrc/quant_ops.cpp).

`make venv` builds them at install time (setup.py) for x86-64 CPUs with AVX2 and FMA. They
are used only where every condition holds: the module imported, this CPU has AVX2 (torch
says so), and the engine's `fused` setting is on
(`STRATA_FUSED`, read in strata/config.py). Elsewhere (another CPU, no compiler at
install, an accelerator) the model runs the equivalent torch ops; tests compare the two.
"""

from __future__ import annotations

import logging
from types import ModuleType

import torch

from strata.config import QUANT_ISA_ENV, fused_enabled, quant_isa_from_env
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
