"""The prepared-model cache: what loading derives from a model file, kept for the next start.

Opening a GGUF file parses its metadata (the vocabulary and merges: most of a start),
dequantises every tensor, fuses q|k|v and gate|up, repacks the 4-bit codes for torch's
int4 kernel and quantises the LM head. None of that changes between runs, so after the
first load the built model (its tensors exactly as built, plus config and tokenizer) is
written once with `torch.save`, and later starts map it back with `torch.load(mmap=True)`:
no parse, no copy, the pages read from the page cache on first touch.

An entry is keyed by the model file's identity (real path, size, mtime, inode), how it
was built (dtype, --weights, devices, $STRATA_Q4_KERNEL, the head's kernel, the instruction
sets the forms were chosen for: torch's CPU capability and strata's quantized kernels', which
`$STRATA_QUANT_ISA` or another CPU sharing the directory changes) and the source of the classes it pickles, so an
edited file, another build or another strata gives a new key, never a stale model.
The rotary tables are rebuilt after loading (they depend on --max-context). Only CPU builds are
cached. The directory is `$STRATA_CACHE_DIR`, else `$XDG_CACHE_HOME/strata`, else
`~/.cache/strata`; `STRATA_CACHE_DIR=off` turns the cache off. It keeps the
`MAX_ENTRIES` entries used last. Entries are pickles that `torch.load` runs: the
directory is as trusted as the user's own files (never point it at shared storage).
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import tokenizers
import torch

import strata.models
from strata.config import CACHE_ENV, prepared_cache_dir, q4_kernel_from_env

from strata.loader.tokenizer import Tokenizer
from strata.models.config import ModelConfig
from strata.models.fused import load_quant_ops
from strata.models.head import head_kernel
from strata.models.llama import LlamaModel

log = logging.getLogger("strata.loader")

FORMAT = 4  # bump when what an entry holds changes shape
MAX_ENTRIES = 4
# The modules whose classes an entry pickles: their source is part of the key.
_PICKLED_MODULES = ("head.py", "layers.py", "linear.py", "llama.py", "config.py", "quant.py", "q4.py", "q4x8.py",
                    "gemma3.py", "moe_block.py", "moe_model.py", "packed.py", "../models/experts.py")


@dataclass
class PreparedModel:
    config: ModelConfig
    tokenizer: Tokenizer
    fingerprint: str
    model: LlamaModel
    widened_q5_0_blocks: int  # the file's (ModelSource.widened_q5_0_blocks), so a mapped entry needs no parse


def cache_dir() -> str | None:
    """Where entries live; None when the cache is off (strata/config.py reads the environment)."""
    return prepared_cache_dir()


def quant_isa() -> str | None:
    """The quantized kernels' instruction set in this process (None: not loaded): which forms
    --weights auto builds follows it (models/linear.py, models/head.py)."""
    ops = load_quant_ops()
    return ops.quant_isa() if ops is not None else None


def cache_key(path: str, dtype: str, weights: str, devices: Sequence[str]) -> str | None:
    """The entry's name for this model file and build; None when it is not cacheable."""
    if cache_dir() is None or not os.path.isfile(path) or any(d != "cpu" for d in devices):
        return None
    st = os.stat(path)
    h = hashlib.sha256()
    h.update(repr((FORMAT, torch.__version__, os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino,
                   dtype, weights, tuple(devices), q4_kernel_from_env(), head_kernel(),  # the forms built
                   torch.backends.cpu.get_cpu_capability(), quant_isa())).encode())
    models_dir = os.path.dirname(os.path.abspath(strata.models.__file__))
    for name in _PICKLED_MODULES:
        with open(os.path.join(models_dir, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:32]


def load(key: str) -> PreparedModel | None:
    """The entry `key` mapped back (no rotary tables or ops yet: `prepare_runtime`); None if absent
    or unreadable."""
    file = os.path.join(cache_dir(), f"{key}.pt")
    if not os.path.isfile(file):
        return None
    try:
        entry = torch.load(file, mmap=True, weights_only=False)
        tok = entry["tokenizer"]
        tokenizer = Tokenizer(tokenizers.Tokenizer.from_str(tok["backend"]), bos_token_id=tok["bos_token_id"],
                              eos_token_ids=tok["eos_token_ids"], add_bos=tok["add_bos"],
                              chat_template=tok["chat_template"], source=tok["source"])
        model = entry["model"]
        os.utime(file)  # most recently used
        return PreparedModel(entry["config"], tokenizer, entry["fingerprint"], model, entry["widened_q5_0_blocks"])
    except Exception as exc:  # a damaged or foreign entry is rebuilt, never trusted
        log.warning("prepared-model cache entry %s is unreadable (%s): rebuilding it", file, exc)
        return None


def save(key: str, prepared: PreparedModel) -> None:
    """Writes the entry atomically (a temporary name, then rename); failures only log."""
    folder = cache_dir()
    tok = prepared.tokenizer
    entry = {
        "config": prepared.config,
        "fingerprint": prepared.fingerprint,
        "tokenizer": {"backend": tok.backend.to_str(), "bos_token_id": tok.bos_token_id,
                      "eos_token_ids": list(tok.eos_token_ids), "add_bos": tok.add_bos,
                      "chat_template": tok.chat_template, "source": tok.source},
        "model": prepared.model,
        "widened_q5_0_blocks": prepared.widened_q5_0_blocks,
    }
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(entry, f)
            os.replace(tmp, os.path.join(folder, f"{key}.pt"))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        trim(folder)
    except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as a RuntimeError
        log.warning("could not write the prepared-model cache in %s (%s)", folder, exc)


def trim(folder: str) -> None:
    """Deletes all but the `MAX_ENTRIES` entries used last."""
    entries = sorted(glob.glob(os.path.join(folder, "*.pt")), key=os.path.getmtime, reverse=True)
    for old in entries[MAX_ENTRIES:]:
        try:
            os.unlink(old)
        except OSError:
            pass
