"""Shared benchmark plumbing: arms in child processes, interleaved rounds, medians, tables."""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from tqdm import tqdm

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
# `make venv` installs matplotlib (pyproject's test extra); another set-up asks for the bench extra
INSTALL_PLOTS = "pip install -e '.[bench]' (or `make venv`, which installs it with the test extra)"


def pyplot():
    """matplotlib.pyplot drawing to files (the Agg backend), or None where matplotlib is not
    installed: then the benchmark's numbers are still written and it says how to get the plot."""
    try:
        import matplotlib
    except ImportError:
        print(f"no plot: matplotlib is not installed; {INSTALL_PLOTS}", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def peak_rss_mib() -> float:
    """This process's peak resident set size: /proc's VmHWM, which starts afresh at exec
    (getrusage's ru_maxrss keeps the parent's peak across fork and exec, so an arm lighter than
    the benchmark that started it would read the parent's); getrusage where there is no /proc."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    """This process's resident set size now."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def available_mib() -> float:
    """The host's MemAvailable now (what a new allocation can take without swapping)."""
    import psutil

    return psutil.virtual_memory().available / 2**20


def host_busy_cpu_s() -> float:
    """CPU seconds all CPUs of the host have spent busy since boot (everything but idle/iowait)."""
    import psutil

    t = psutil.cpu_times()
    return sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq", "steal"))


def wait_for_quiet(max_wait_s: float, busy_percent: float = 25.0) -> dict:
    """Waits up to `max_wait_s` until the host's CPUs are mostly idle (a shared machine: other
    work can load both cores and make any arm several times slower). Call it while the arms
    themselves are idle; returns what the CPUs were doing when it gave up or got its quiet."""
    import psutil

    t = time.perf_counter()
    busy = psutil.cpu_percent(interval=2 if max_wait_s > 0 else 0.5)
    while busy > busy_percent and time.perf_counter() - t < max_wait_s:
        busy = psutil.cpu_percent(interval=5)
    return {"cpu_busy_percent": busy, "loadavg_1m": os.getloadavg()[0],
            "waited_s": time.perf_counter() - t, "quiet": busy <= busy_percent}


def run_arm(script: str, arm: str, args: Sequence[str], timeout: float = 1800) -> dict:
    """Runs `script --arm ARM ...` in a fresh interpreter; its last stdout line is a JSON dict."""
    cmd = [sys.executable, script, "--arm", arm, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"arm {arm} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def progress_bar(total: int, desc: str, unit: str = "run") -> tqdm:
    """A progress bar on stderr, quiet when stderr is not a terminal (`bar.write` still prints)."""
    return tqdm(total=total, desc=desc, unit=unit, disable=None, file=sys.stderr, leave=False)


def interleaved(arms: Sequence[str], rounds: int, run: Callable[[str], dict]) -> dict[str, list[dict]]:
    """Round-robin the arms `rounds` times so drift on a shared machine hits every arm alike."""
    results: dict[str, list[dict]] = {a: [] for a in arms}
    with progress_bar(rounds * len(arms), "rounds x arms") as bar:
        for r in range(rounds):
            for arm in arms:
                t = time.perf_counter()
                results[arm].append(run(arm))
                bar.write(f"  round {r + 1}/{rounds} {arm}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
                bar.update(1)
    return results


def engine_with_env(config, **env: str):
    """An in-process strata Engine built while the environment holds `env` (the kernel choices
    read at build: STRATA_DENSE_GEMM, STRATA_PROMPT_ATTENTION, ...), restored after."""
    from strata.engine.engine import Engine

    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return Engine(config, progress=False)
    finally:
        for k, v in before.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def cold_prompt_ms(engine, ids: Sequence[int]) -> float:
    """ms for `engine` to read `ids` and sample one token; its cache is cleared after, so the
    next prompt shares no prefix."""
    from strata.sampling import SamplingParams

    t = time.perf_counter()
    engine.submit(list(ids), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    engine.run_until_done()
    ms = (time.perf_counter() - t) * 1e3
    engine._scheduler.clear_cache()
    return ms


def medians(rows: list[dict]) -> dict[str, float]:
    keys = [k for k, v in rows[0].items() if isinstance(v, (int, float))]
    return {k: statistics.median(r[k] for r in rows) for k in keys}


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence]) -> str:
    widths = [max(len(str(c)), *(len(_fmt(r[i])) for r in rows)) for i, c in enumerate(columns)]
    lines = [title, " | ".join(str(c).ljust(w) for c, w in zip(columns, widths)),
             "-|-".join("-" * w for w in widths)]
    lines += [" | ".join(_fmt(v).ljust(w) for v, w in zip(r, widths)) for r in rows]
    text = "\n".join(lines)
    print(text)
    return text


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.1f}"
    return str(v)


def add_quick_and_out(p, quick: str) -> None:
    """Every benchmark's `--quick` (a few seconds of real work on a small configuration, so the
    script stays runnable: tests/bench/test_quick.py runs each) and `--out DIR`."""
    p.add_argument("--quick", action="store_true", help=f"smoke run: {quick}")
    p.add_argument("--out", default=RESULTS_DIR, help=f"directory for the JSON and PNG (default {RESULTS_DIR})")


def write_json(name: str, payload: dict, out: str = RESULTS_DIR) -> str:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
    return path


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), for every benchmark's title."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
