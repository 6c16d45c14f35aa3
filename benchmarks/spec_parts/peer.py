"""llama.cpp's own speculative decoding as a peer: only where a build is on PATH. This
benchmark never builds it; without one it records why the peer is missing."""

from __future__ import annotations

import shutil

BINARIES = ("llama-server", "llama-lookup")  # --spec-type ngram... / lookup decoding


def detect() -> dict:
    found = {b: shutil.which(b) for b in BINARIES}
    if not any(found.values()):
        return {"available": False, "binaries": found,
                "note": "no llama.cpp build on PATH (llama-server / llama-lookup): peer not measured"}
    return {"available": True, "binaries": found,
            "note": "llama.cpp found but its speculative arm is not wired into this benchmark yet: not measured"}
