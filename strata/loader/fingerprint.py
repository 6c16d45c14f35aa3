"""The model's fingerprint: a digest of its weights, so a session file names the exact model.

Two fine-tunes of one architecture share their config, their file sizes and often their
first bytes (the GGUF header, the safetensors index); only the weights differ. So the
fingerprint is SHA-256 over the model config and every byte of every weights file, read
once at load in 8 MiB blocks: measured 0.095 s for the default model's 98 MB GGUF
(about 1 GB/s on these cores, docs/sessions.md). It is computed, not cached: a
cache keyed by (size, mtime) goes stale under a copy that keeps the mtime, and one read
at load costs less than the load itself (3.5 s for the default model).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

from strata.models.config import ModelConfig

READ_BLOCK = 8 << 20
WEIGHT_SUFFIXES = (".safetensors", ".gguf")


def weight_files(path: str) -> list[str]:
    """The files that hold `path`'s weights: the file itself, or a directory's weight files (sorted)."""
    if os.path.isfile(path):
        return [path]
    return sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(WEIGHT_SUFFIXES))


def weights_fingerprint(path: str, config: ModelConfig) -> str:
    """32 hex digits of SHA-256(config without its name, then each weight file's size and bytes)."""
    h = hashlib.sha256(repr(dataclasses.replace(config, name="")).encode())  # a copy elsewhere is the same model
    buf = bytearray(READ_BLOCK)
    view = memoryview(buf)
    for f in weight_files(path):
        h.update(str(os.path.getsize(f)).encode())  # the weights, not the file's name
        with open(f, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                h.update(view[:n])
    return h.hexdigest()[:32]
