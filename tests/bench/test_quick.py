"""Every benchmark's `--quick` run, so none rots: a few seconds of real work each, on a small
configuration of the default model, writing its JSON (and PNG, where it draws one) to a
temporary directory and printing its table. Peers (llama.cpp, vLLM; transformers where it
is a peer) are left out of quick runs, which say so. Timings from these runs mean nothing;
the assertions are that each script runs to its end and writes what it says it writes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import require, require_default_model, require_gemma3_file
from tests.ports import held_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
TIMEOUT_S = 900  # one script on a busy 2-core machine
TABLE_RULE = re.compile(r"^-+(-\|-+)+$", re.M)  # benchmarks/common.py's print_table: under the header


# script -> (arguments besides --quick, files written under the output directory, what its output must say)
QUICK = {
    "decode": ([], ["decode.json", "decode.png"], ["--quick: strata's arm only"]),
    "dense_gemm": ([], ["dense_gemm.json", "dense_gemm.png"], ["x oneDNN"]),
    "head_quality": ([], ["head_quality-first2.json"], []),
    "kv_quality": ([], ["kv_quality-int8-vs-bf16-first2.json"], []),
    "prefill_profile": ([], ["prefill_profile.json"], []),
    "prompt_attention": ([], ["prompt_attention.json", "prompt_attention.png"], ["x SDPA"]),
    "prompt_quant_quality": ([], ["prompt_quant_quality-first2.json", "prompt_quant_quality-first2.png"], []),
    "step_profile": ([], ["step_profile.json", "step_profile.png"], []),
    "session": ([], ["session.json", "session.png"], ["llama-server:"]),
    "spec": ([], ["spec.json", "spec.png"], ["llama.cpp peer:"]),
    "serve": ([], ["serve-quick.json", "serve-quick.png"], ["--quick: strata's arm only"]),
    "pool": ([], ["pool-quick.json", "pool-move-quick.png", "pool-prefix-quick.png"], []),
    "ring": ([], ["ring.json", "ring.png"], ["against its streamed bytes copied alone"]),
    "quant_kernels": ([], ["quant_kernels-576-192-1536.json", "quant_kernels-576-192-1536.png"], []),
    "soak": (["--out", "{out}/soak.json"], ["soak.json", "soak.png"], []),
    "flood": ([], ["flood.json", "flood.png"], ["the save answered 409 directory_missing"]),
    "cluster": (["--port", "{port}"], ["cluster.json", "cluster.png"], []),
    "grammar": ([], ["grammar.json", "grammar.png"], ["schema compile"]),
    "moe": ([], ["moe-quick.json", "moe-quick.png"], ["--quick: strata's arms only"]),
    "moe_cache": ([], ["moe_cache.json", "moe_cache.png"], ["policy by measurement", "x Belady bytes"]),
    "window": ([], ["window-quick.json", "window-quick.png"], ["groups / keep:", "SYNTHETIC"]),
    "ring_window": ([], ["ring_window-quick.json"], ["per group / one ring:", "same greedy tokens: True", "SYNTHETIC"]),
}
# Not Python benchmarks: ring_cuda.sh and moe_cuda.sh run the ring's and the expert cache's tests on a CUDA machine.
NOT_BENCHMARKS = {"__init__.py", "common.py"}


def test_every_benchmark_has_a_quick_run():
    scripts = {f.removesuffix(".py") for f in os.listdir(BENCHMARKS) if f.endswith(".py")} - {
        f.removesuffix(".py") for f in NOT_BENCHMARKS}
    assert scripts == set(QUICK)


@pytest.mark.parametrize("name", sorted(QUICK))
def test_quick_run_writes_its_files_and_prints_its_table(name, tmp_path):
    require_default_model()
    require("matplotlib")
    if name == "cluster":
        require("ray.serve")
    if name in ("window", "ring_window"):  # Gemma 3 270M's sliding-window geometry
        require_gemma3_file()
    args, files, says = QUICK[name]
    out = tmp_path / name
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    with held_port() as port:  # Ray Serve's proxy (cluster.py --port) binds it beside this socket
        args = [a.format(out=out, port=port) for a in args]
        if "--out" not in args:
            args += ["--out", str(out)]
        run = subprocess.run([sys.executable, os.path.join(BENCHMARKS, f"{name}.py"), "--quick", *args], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert run.returncode == 0, f"{name} --quick failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    for f in files:
        path = out / f
        assert path.is_file() and path.stat().st_size > 0, f"{name} --quick did not write {f}: {os.listdir(out)}"
    assert TABLE_RULE.search(run.stdout), f"{name} --quick printed no table:\n{run.stdout[-2000:]}"
    for text in says:
        assert text in run.stdout, f"{name} --quick does not say {text!r}"
