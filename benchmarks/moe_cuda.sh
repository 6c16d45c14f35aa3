#!/usr/bin/env bash
# The expert cache and the device budget on a CUDA machine: the cache's tests with the slots on
# the GPU (host experts pinned, prefetch copies on a side stream), the engine-level tests, then
# benchmarks/moe_cache.py. Installs nothing: run it from an environment whose torch sees the GPU,
# with strata importable.
#
#   benchmarks/moe_cuda.sh [RESULTS_DIR] [moe_cache.py arguments...]
#
# RESULTS_DIR (default benchmarks/results) receives moe_cache.json, moe_cache.png,
# moe_cuda.txt (the benchmark's output), moe_cuda_tests.txt and moe_cuda_gpu.txt. MOE_TESTS
# overrides the pytest selection. Exit status: non-zero when the tests or the benchmark failed.
set -uo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-$repo/benchmarks/results}")"  # a relative RESULTS_DIR is the caller's
shift $(( $# > 0 ? 1 : 0 ))
cd "$repo" || exit 1
py="${PYTHON:-python}"
mkdir -p "$out"

"$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "torch sees no CUDA device")' || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/moe_cuda_gpu.txt" 2>&1

# shellcheck disable=SC2086  # MOE_TESTS is a list of pytest arguments
STRATA_TEST_DEVICES=cuda "$py" -m pytest -q ${MOE_TESTS:-tests/unit/test_moe_cache.py tests/unit/test_moe_cache_counts.py tests/unit/test_moe_budget.py tests/unit/test_moe_experts.py tests/model/test_moe_cache_engine.py} 2>&1 | tee "$out/moe_cuda_tests.txt"
tests=${PIPESTATUS[0]}

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$py" benchmarks/moe_cache.py --out "$out" "$@" 2>&1 | tee "$out/moe_cuda.txt"
bench=${PIPESTATUS[0]}

echo "moe tests: exit $tests; moe benchmark: exit $bench (results in $out)"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
