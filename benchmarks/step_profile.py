"""Where one decode step's time goes, op by op: the fused CPU ops against torch ops.

    python benchmarks/step_profile.py [--lanes 1 8] [--steps 20] [--threads 2] [--arms A,B] [--quick]

The default model in bf16 (`--weights auto`), each lane at ~560 cells of context (a
512-token prompt, then decoding), as in `../shared/notes/decode-step-profile.md`. For each
lane count, one engine profiles `--steps` engine steps under `torch.profiler` with the
fused decode ops (strata/csrc; its attention in the instruction set chosen at run time; each
layer one extension call, models/fused_layer.py), on
CPUs with AVX-512 with the attention's AVX2 variant forced (arm "fused, AVX2 attention":
what the AVX-512 variant adds), with the fused ops but decode attention through torch's
SDPA reads (arm "fused, SDPA reads": what the fused attention kernel adds), and with them
off (`STRATA_FUSED=0` semantics: the model's torch ops), and with the fused ops' calls (every
arm but "fused" runs the layers' Python path, the ops one call each; pybind
calls, which torch's profiler does not see: the x8 projections, norms, attention) each under
record_function (arm "fused, calls recorded", a second table: the step by group, and what no
op accounts for: Python, dispatch, the scheduler), interleaved. The table lists, per arm, ms per step for the heaviest ops by
self CPU time; the JSON has every op; the PNG stacks each arm's step by op (both in
benchmarks/results, or under --out). `--quick`: 1 lane at ~80 cells, 2 steps per arm, one pass.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, cpu_name, print_table, pyplot, write_json
from benchmarks.decode import prompt_ids

TOP = 8
ALL_ARMS = ("fused", "fused, AVX2 attention", "fused, SDPA reads", "torch", "fused, calls recorded")
ARMS_SEP = ";"  # --arms separator (arm names hold commas)
# op name -> group (the first pattern it contains) for the "fused, calls recorded" arm's breakdown
GROUPS = (("strata::x8", "projections"), ("int4pack", "projections"), ("strata::quant", "projections"),
          ("aten::linear", "dense GEMMs (the LM head above its int8 rows)"),
          ("aten::mm", "dense GEMMs (the LM head above its int8 rows)"),
          ("aten::addmm", "dense GEMMs (the LM head above its int8 rows)"), ("int8pack", "LM head (int8)"),
          ("strata::decode_attention", "attention"), ("scaled_dot_product", "attention"),
          ("strata::", "norms, silu, rope (fused)"))


class Recorded:
    """The fused ops module with every call under record_function: its functions are pybind
    calls, which torch's profiler does not see (their time is otherwise nobody's)."""

    def __init__(self, ops):
        self._ops = ops

    def __getattr__(self, name: str):
        from torch.profiler import record_function

        fn = getattr(self._ops, name)
        if not callable(fn) or isinstance(fn, type):
            return fn

        def call(*args, **kwargs):
            with record_function(f"strata::{name}"):
                return fn(*args, **kwargs)

        return call


def recorded_x8():
    """A context in which X8Matmul's calls (a pybind object's) are recorded as strata::x8."""
    import contextlib

    from torch.profiler import record_function

    from strata.models.q4x8 import X8Matmul

    @contextlib.contextmanager
    def ctx():
        plain = X8Matmul.__call__

        def call(self, x):
            with record_function("strata::x8"):
                return plain(self, x)

        X8Matmul.__call__ = call
        try:
            yield
        finally:
            X8Matmul.__call__ = plain

    return ctx()


def grouped(ms_per_step: float, by_op: dict[str, float]) -> dict[str, float]:
    """group -> ms per step: GROUPS, the other torch ops, and the rest of the step's wall time
    (Python, dispatch, the scheduler: no op's self time)."""
    out: dict[str, float] = {}
    for op, ms in by_op.items():
        group = next((g for pat, g in GROUPS if pat in op), "other torch ops")
        out[group] = out.get(group, 0.0) + ms
    out["Python, dispatch, scheduler (unprofiled)"] = ms_per_step - sum(by_op.values())
    return out


def arms_here() -> tuple[str, ...]:
    """ALL_ARMS less the AVX2-attention arm where AVX2 is all the kernel has (it is "fused")."""
    from strata.models.fused import load_decode_ops

    ops = load_decode_ops(enabled=True)
    wide = ops is not None and len(ops.attention_isas()) > 1
    return tuple(a for a in ALL_ARMS if wide or a != "fused, AVX2 attention")


def profile_steps(engine, steps: int) -> tuple[float, dict[str, float]]:
    """(ms per step, op -> self CPU ms per step) over `steps` steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            engine.step()
        wall = (time.perf_counter() - t) / steps * 1e3
    ops = {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}
    return wall, ops


def run(lanes: int, steps: int, threads: int, prompt: int = 512, passes: int = 2,
        arms: tuple[str, ...] = ALL_ARMS) -> dict:
    import torch

    from strata.config import EngineConfig
    from strata.engine.engine import Engine
    from strata.sampling import SamplingParams

    torch.set_num_threads(threads)
    engine = Engine(EngineConfig(dtype="bfloat16", weights="auto", max_context=prompt + 4 * steps + 128, kv_chunk=128,
                                 batch=lanes - 1, prefill_chunk=prompt, threads=threads, spec="off"),
                    progress=False)  # spec off: every profiled step decodes one token per lane
    params = SamplingParams(temperature=0, max_tokens=4 * steps + 64, ignore_eos=True)
    for i in range(lanes):
        engine.submit(prompt_ids(engine.tokenizer, prompt, 20 + i), params)
    for _ in range(lanes + min(16, steps)):  # prompts read, a few warm decode steps
        engine.step()
    model = engine._model
    ops = model.ops
    out = {}
    import contextlib

    forms = [layer.fused for layer in model.layers]  # one call per layer (models/fused_layer.py)
    for arm in arms * passes:
        model.ops = None if arm == "torch" else Recorded(ops) if arm == "fused, calls recorded" else ops
        for layer, form in zip(model.layers, forms):  # only "fused" runs them: the others show the ops
            layer.fused = form if arm == "fused" else None
        if arm == "fused, SDPA reads":  # the fused ops, but decode attention through torch's SDPA reads
            model.decode_attention_kernel = lambda kv_dtype: None
        if arm == "fused, AVX2 attention":
            ops.set_attention_isa("avx2")
        with recorded_x8() if arm == "fused, calls recorded" else contextlib.nullcontext():
            wall, by_op = profile_steps(engine, steps)
        model.__dict__.pop("decode_attention_kernel", None)
        if ops is not None:
            ops.set_attention_isa("auto")
        prev = out.get(arm)
        if prev is None or wall < prev["ms_per_step"]:  # the quieter of two rounds
            out[arm] = {"ms_per_step": wall, "ops": by_op}
    engine._model.ops = ops
    for layer, form in zip(model.layers, forms):
        layer.fused = form
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lanes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--arms", default="", help="semicolon-separated arms to run (default: all; 'fused' is always run)")
    add_quick_and_out(p, "1 lane at ~80 cells, 2 steps per arm, one pass")
    args = p.parse_args()
    args.prompt, args.passes = 512, 2
    if args.quick:
        args.lanes, args.steps, args.prompt, args.passes = [1], 2, 32, 1
    from strata.models.fused import kernel_paths, load_decode_ops

    arms = arms_here()
    if args.arms:
        chosen = {a.strip() for a in args.arms.split(ARMS_SEP)}
        arms = tuple(a for a in arms if a == "fused" or a in chosen)
    paths = kernel_paths(load_decode_ops(enabled=True))
    results = {}
    for lanes in args.lanes:
        res = results[lanes] = run(lanes, args.steps, args.threads, args.prompt, args.passes, arms)
        top = sorted({op for arm in arms for op in sorted(res[arm]["ops"], key=res[arm]["ops"].get)[-TOP:]},
                     key=lambda k: -max(res[arm]["ops"].get(k, 0) for arm in arms))
        rows = [[op] + [res[arm]["ops"].get(op, 0.0) for arm in arms] for op in top]
        rows.append(["step (wall)"] + [res[arm]["ms_per_step"] for arm in arms])
        rows.append(["tok/s"] + [lanes * 1e3 / res[arm]["ms_per_step"] for arm in arms])
        if "fused, calls recorded" in res:
            rec = res["fused, calls recorded"]
            groups = grouped(rec["ms_per_step"], rec["ops"])
            print_table(f"decode step, {lanes} lane(s), fused ops with every call recorded "
                        f"({rec['ms_per_step']:.2f} ms per step against {res['fused']['ms_per_step']:.2f} unrecorded): "
                        f"ms per step by group", ["group", "ms", "share"],
                        [[g, ms, f"{ms / rec['ms_per_step']:.0%}"] for g, ms in sorted(groups.items(), key=lambda x: -x[1])])
            res["groups"] = groups
        ratio = (lambda a: f"{res[a]['ms_per_step'] / res['fused']['ms_per_step']:.2f}x" if a in res else "not run")
        wide = (f"; AVX2 attention / {paths['attention']} = "
                f"{res['fused, AVX2 attention']['ms_per_step'] / res['fused']['ms_per_step']:.2f}x"
                if "fused, AVX2 attention" in res else "")
        print_table(f"decode step, {lanes} lane(s) at ~{args.prompt + 48} cells, bf16, {args.threads} threads, "
                    f"{cpu_name()} (kernels: {paths}): self CPU ms per "
                    f"step (torch / fused = {ratio('torch')}; SDPA reads / fused attention = "
                    f"{ratio('fused, SDPA reads')}{wide})",
                    ["op", *arms], rows)
    path = write_json("step_profile.json", {"args": vars(args), "cpu": cpu_name(), "kernels": paths,
                                            "results": results}, args.out)
    plot(results, os.path.join(args.out, "step_profile.png"))
    print(f"raw numbers: {path}")


def plot(results: dict, path: str) -> None:
    plt = pyplot()
    if plt is None:
        return

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for ax, (lanes, res) in zip(axes[0], results.items()):
        res = {a: r for a, r in res.items() if a in ALL_ARMS}
        ops = sorted({op for arm in res.values() for op in arm["ops"]},
                     key=lambda op: -max(arm["ops"].get(op, 0) for arm in res.values()))[:TOP]
        arms = [a for a in ALL_ARMS if a in res]
        for x, arm in enumerate(reversed(arms)):
            bottom = 0.0
            for i, op in enumerate(ops):
                h = res[arm]["ops"].get(op, 0.0)
                ax.bar(x, h, bottom=bottom, color=f"C{i}", label=op if x == 0 else None)
                bottom += h
            ax.bar(x, max(0.0, res[arm]["ms_per_step"] - bottom), bottom=bottom, color="lightgrey",
                   label="everything else" if x == 0 else None)
        ax.set_xticks(range(len(arms)), list(reversed(arms)), fontsize=8)
        ax.set_ylabel("ms per decode step")
        ax.set_title(f"{lanes} lane(s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
