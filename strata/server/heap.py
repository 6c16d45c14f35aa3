"""Giving the C heap's free memory back to the system: glibc's `malloc_trim`, called by the
engine thread between two steps at most every `every_s` seconds ($STRATA_HEAP_TRIM, read in
strata/config.py). The allocator keeps pages that freed step temporaries leave inside its
arenas; a trim returns the wholly free ones. Where the C library has no `malloc_trim` (not
glibc), nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


class HeapTrim:
    def __init__(self, every_s: float | None):
        self.every_s = every_s
        self._trim = _malloc_trim() if every_s is not None else None
        self._last = time.monotonic()
        self.num_trims = 0

    def between_steps(self) -> None:
        if self._trim is None:
            return
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._trim(0)
            self._last = now
            self.num_trims += 1
