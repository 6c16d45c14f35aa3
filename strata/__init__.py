"""strata: an LLM inference engine with one shared, chunked KV pool for all lanes."""

from strata.config import EngineConfig
from strata.llm import LLM, Completion
from strata.sampling import SamplingParams

__all__ = ["LLM", "Completion", "EngineConfig", "SamplingParams"]
__version__ = "0.1.0"
