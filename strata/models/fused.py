"""The fused CPU decode ops (strata/csrc/decode_ops.cpp), when built and usable here, and the
quantized-weight kernels in the same module (strata/csrc/quant_ops.cpp).

`make venv` builds them at install time (setup.py) for x86-64 CPUs with AVX2 and FMA. They
are used only where every condition holds: the module imported, this CPU has AVX2 (torch
says so), and `STRATA_FUSED` is not 0/false/off. Elsewhere (another CPU, no compiler at
install, an accelerator) the model runs the equivalent torch ops; tests compare the two.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

import torch

from strata.config import QUANT_ISA_ENV, quant_isa_from_env
from strata.errors import ConfigError

log = logging.getLogger("strata")

FUSED_ENV = "STRATA_FUSED"


def fused_enabled() -> bool:
    """False when $STRATA_FUSED says off; any other value than on/off words is an error."""
    value = os.environ.get(FUSED_ENV, "").strip().lower()
    if value in ("", "1", "true", "on"):
        return True
    if value in ("0", "false", "off"):
        return False
    raise ValueError(f"${FUSED_ENV} must be 1/true/on or 0/false/off, got {os.environ[FUSED_ENV]!r}")


def load_decode_ops() -> ModuleType | None:
    """The extension module, or None where it must not or cannot be used."""
    if not fused_enabled():
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
    isa = quant_isa_from_env(os.environ)
    if isa != "auto" and isa not in _decode_ops.quant_isas():
        raise ConfigError(f"${QUANT_ISA_ENV}={isa}: this CPU runs only {', '.join(_decode_ops.quant_isas())}")
    _decode_ops.set_quant_isa(isa)
    return _decode_ops
