#!/usr/bin/env bash
# The resident K/V ring on a CUDA machine: the ring's exactness tests, then benchmarks/ring.py
# with every layer on the GPU (the pool pinned in host memory, copies on a side stream).
# Installs nothing: run it from an environment whose torch sees the GPU, with strata importable.
#
#   benchmarks/ring_cuda.sh [RESULTS_DIR] [ring.py arguments...]
#
# RESULTS_DIR (default benchmarks/results) receives ring.json, ring.png, ring_cuda.txt (the
# benchmark's output), ring_window.json and ring_window_cuda.txt (benchmarks/ring_window.py: the
# ring per sliding-window layer group on Gemma 3 270M), ring_cuda_tests.txt and ring_cuda_gpu.txt. The default is the seed's
# sizes (--scale 1: tiers 1K / 32K / 128K, default ring 32768, cap 49152; about 17 GiB of host
# memory for the four arms' pools) with 128 new tokens x 5 rounds; later arguments override it
# (the seed's 256 tokens: --new 256; a short check: --new 32 --rounds 3 --pages '' ).
# RING_TESTS overrides the pytest selection (default: the ring's test files). Exit status:
# non-zero when the tests or the benchmark failed.
set -uo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-$repo/benchmarks/results}")"  # a relative RESULTS_DIR is the caller's
shift $(( $# > 0 ? 1 : 0 ))
cd "$repo" || exit 1
py="${PYTHON:-python}"
mkdir -p "$out"

"$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "torch sees no CUDA device")' || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/ring_cuda_gpu.txt" 2>&1

# shellcheck disable=SC2086  # RING_TESTS is a list of pytest arguments
STRATA_TEST_DEVICES=cuda "$py" -m pytest -q ${RING_TESTS:-tests/model/test_ring_layouts.py tests/model/test_ring_window_groups.py tests/unit/test_residency.py tests/unit/test_ring_rule.py} 2>&1 | tee "$out/ring_cuda_tests.txt"
tests=${PIPESTATUS[0]}

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$py" benchmarks/ring.py --device cuda --scale 1 --new 128 \
    --rounds 5 --threads 4 --out "$out" "$@" 2>&1 | tee "$out/ring_cuda.txt"
bench=${PIPESTATUS[0]}

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$py" benchmarks/ring_window.py --device cuda --ctx 32768 \
    --ring 8192 --new 64 --threads 4 --out "$out" 2>&1 | tee "$out/ring_window_cuda.txt"
window=${PIPESTATUS[0]}

echo "ring tests: exit $tests; ring benchmark: exit $bench; ring_window benchmark: exit $window (results in $out)"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ] && [ "$window" -eq 0 ]
