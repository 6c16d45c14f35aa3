"""moe_cache.png: bytes per token by policy and prefetch against Belady for each trace, and
the budget's bytes per token by arm at each depth."""

from __future__ import annotations


def plot(cache_rows: list[dict], depths: dict, title: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(r["trace"] for r in cache_rows))
    fig, axes = plt.subplots(1, len(traces) + 1, figsize=(4.5 * (len(traces) + 1), 4.5))
    for ax, trace in zip(axes, traces):
        rows = [r for r in cache_rows if r["trace"] == trace]
        for arm in dict.fromkeys(r["arm"] for r in rows):
            pts = [(r["slots"], r["mib_per_token"]) for r in rows if r["arm"] == arm]
            ax.plot(*zip(*pts), marker="o", label=arm, linestyle="--" if arm == "belady" else "-")
        ax.set(xlabel="expert slots per layer", ylabel="MiB copied per token", title=trace)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[-1]
    tiers = list(depths)
    arms = list(next(iter(depths.values())))
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        xs = [t + (i - (len(arms) - 1) / 2) * width for t in range(len(tiers))]
        ax.bar(xs, [max(depths[t][arm]["mib_per_token"], 1e-3) for t in tiers], width, label=arm)
    ax.set_yscale("log")
    ax.set_xticks(range(len(tiers)), tiers)
    ax.set(ylabel="MiB copied per token (log)", title="one device budget: experts + ring")
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
