"""ring.png: paired decode tok/s ratios and MiB streamed per token for each arm at each tier,
and the page sweep at the deep tier (when it ran)."""

from __future__ import annotations

from benchmarks.common import pyplot

MIB = 1 << 20


def _bars(ax, groups: list[str], series: dict[str, list[float]], ylabel: str, title: str, ncol: int = 1) -> None:
    width = 0.8 / max(1, len(series))
    for i, (name, ys) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, ys, width, label=name)
    ax.set_xticks(range(len(groups)), groups)
    ax.set(ylabel=ylabel, title=title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=ncol, loc="upper center")


def plot(tiers: dict[str, dict], cells: dict[str, int], pages: dict | None, title: str, path: str) -> None:
    plt = pyplot()
    if plt is None:
        return

    panels = 3 if pages else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.5))
    groups = [f"{t}\n{cells[t]} cells" for t in tiers]
    arms = list(next(iter(tiers.values()))["arms"])
    pairs = list(next(iter(tiers.values()))["ratios"])
    _bars(axes[0], groups, {p: [s["ratios"][p] for s in tiers.values()] for p in pairs},
          "decode tok/s ratio (median of per-round pairs)", "decode speed, arms interleaved", ncol=3)
    axes[0].axhline(1.0, color="black", linewidth=0.8)
    top = max(s["ratios"][p] for s in tiers.values() for p in pairs)
    axes[0].set_ylim(0, top * 1.3)  # room for the legend above the bars
    _bars(axes[1], groups, {a: [s["arms"][a]["bytes_per_token"] / MIB for s in tiers.values()] for a in arms},
          "MiB copied into the ring per decoded token", "bytes streamed per token")
    if pages:
        ax = axes[2]
        names = list(pages["arms"])
        ax.bar(range(len(names)), [pages["arms"][n]["tok_s"] for n in names], 0.5, color="tab:blue")
        ax.set_xticks(range(len(names)), names)
        ax.set(ylabel="decode tok/s (median)", title="deep tier, adaptive arm: page size")
        twin = ax.twinx()
        twin.plot(range(len(names)), [pages["arms"][n]["bytes_per_token"] / MIB for n in names], "o-",
                  color="tab:red")
        twin.set_ylabel("MiB streamed per token", color="tab:red")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
