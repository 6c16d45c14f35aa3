"""The fused CPU decode ops (strata/csrc/decode_ops.cpp), when built and usable here.

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

from strata.config import fused_enabled

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
