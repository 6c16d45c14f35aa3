"""The fused CPU decode ops (strata/csrc/decode_ops.cpp), when built and usable here.

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
