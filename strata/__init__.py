"""strata: an LLM inference engine with one shared, chunked KV pool for all lanes.

The public names load lazily, so `strata --help` and flag errors do not wait for torch.
"""

from importlib import import_module

__all__ = ["LLM", "Completion", "EngineConfig", "SamplingParams"]
__version__ = "0.1.0"

_WHERE = {"LLM": "strata.llm", "Completion": "strata.llm", "EngineConfig": "strata.config",
          "SamplingParams": "strata.sampling"}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'strata' has no attribute {name!r}")
