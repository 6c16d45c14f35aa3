"""What an engine serves, fixed once its model is loaded (`Engine.info`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from strata.loader.tokenizer import Tokenizer


@dataclass(frozen=True)
class EngineInfo:
    tokenizer: Tokenizer
    model_name: str  # the model's own name (GGUF general.name, or its directory)
    max_context: int  # cells per conversation
    vocab_size: int
    fingerprint: str  # the model's weights digest (session files check it)
    num_lanes: int  # the main session and the batch slots
    chunk_size: int  # cells per chunk
    bytes_per_cell: int  # K and V of one position across all layers
    layout: str  # "pooled" | "reserved"
    loaded_from_cache: bool  # the prepared-model cache had this build
    # the instruction sets the kernels run and the forms the projections read (models/fused.py kernel_paths)
    kernels: Mapping[str, object] = field(default_factory=dict)
