"""cluster.png: per workload, each arm's follow-up TTFT p50 and output tok/s as ratios to
round robin, and its cache hit ratio."""

from __future__ import annotations

from benchmarks.common import pyplot


def plot(summaries: dict[str, dict[str, dict]], title: str, path: str) -> None:
    plt = pyplot()
    if plt is None:
        return

    workloads = list(summaries)
    arms = list(dict.fromkeys(a for s in summaries.values() for a in s))
    panels = [("TTFT p50 / round robin (lower is better)", lambda s: s.get("vs_rr", {}).get("ttft_p50_ms")),
              ("output tok/s / round robin", lambda s: s.get("vs_rr", {}).get("out_tok_s")),
              ("cache hit ratio of follow-ups", lambda s: s["hit_ratio"])]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2))
    width = 0.8 / max(1, len(arms))
    for ax, (label, get) in zip(axes, panels):
        for i, arm in enumerate(arms):
            xs = [g + (i - (len(arms) - 1) / 2) * width for g in range(len(workloads))]
            ys = [get(summaries[w][arm]) if arm in summaries[w] else None for w in workloads]
            ax.bar(xs, [y if y is not None else 0 for y in ys], width, label=arm)
        if "round robin" in label:
            ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(workloads)), [f"{w} system prompt" for w in workloads])
        ax.set(title=label)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right", framealpha=0.9)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
