"""Loading a model for an engine: from the prepared-model cache when it has an entry,
else from the model file (then the built model is cached for the next start)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from strata.loader import ModelSource, open_model
from strata.loader import prepared
from strata.loader.build import build_model
from strata.loader.default import default_model_path
from strata.models.llama import LlamaModel

log = logging.getLogger("strata.loader")


class ModelLoad:
    """Config, tokenizer and fingerprint at once; the model itself from `build`, which the
    engine calls after its memory check."""

    def __init__(self, path: str | None, dtype: str, weights: str, devices: Sequence[str],
                 source: ModelSource | None = None):
        self.dtype, self.weights, self.devices = dtype, weights, tuple(devices)
        self.key = None
        self.cached = None
        self.path = source.path if source is not None else (default_model_path() if path is None else path)
        if source is None:
            path = self.path
            self.key = prepared.cache_key(path, dtype, weights, self.devices)
            self.cached = prepared.load(self.key) if self.key is not None else None
            if self.cached is None:
                source = open_model(path, weights=weights, dtype=dtype)
        self.source = source
        origin = self.cached if self.cached is not None else source
        self.config, self.tokenizer, self.fingerprint = origin.config, origin.tokenizer, origin.fingerprint
        self.widened_q5_0_blocks = origin.widened_q5_0_blocks

    @property
    def from_cache(self) -> bool:
        return self.cached is not None

    def build(self, max_positions: int, progress: bool, fused: bool = True) -> LlamaModel:
        """`fused`: the fused CPU decode ops where they apply (EngineConfig.fused)."""
        if self.cached is not None:
            model = self.cached.model
            model.prepare_runtime(max_positions, fused)
            log.info("model mapped from the prepared-model cache (%s)", self.key)
            return model
        model = build_model(self.source, self.dtype, self.devices, max_positions, self.weights, progress, fused)
        if self.key is not None:
            prepared.save(self.key, prepared.PreparedModel(self.config, self.tokenizer, self.fingerprint, model,
                                                                self.widened_q5_0_blocks))
        return model
