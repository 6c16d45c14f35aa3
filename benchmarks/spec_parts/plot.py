"""spec.png: the ngram/off decode tok/s ratio per workload and lane count (with the issue's
targets), acceptance, and the verify step's cost against k (DRAFT_COST's slope)."""

from __future__ import annotations

from benchmarks.common import pyplot


def plot(cells: list[dict], costs: list[dict], title: str, path: str) -> None:
    plt = pyplot()
    if plt is None:
        return

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    labels = [f"{c['workload']}\n{c['lanes']} lane(s)" for c in cells]
    xs = range(len(cells))
    ax = axes[0]
    ax.bar(xs, [c["ratio"] for c in cells], 0.5, color=["tab:green" if c["meets_target"] is not False else "tab:red"
                                                        for c in cells])
    for x, c in zip(xs, cells):
        if c["target"] is not None:
            ax.hlines(c["target"], x - 0.35, x + 0.35, colors="black", linestyles="dashed")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(list(xs), labels)
    ax.set(ylabel="decode tok/s, ngram / off (paired median)", title="speed-up (dashed: issue's target)")
    ax.grid(axis="y", alpha=0.3)
    ax = axes[1]
    acc = [c["arms"]["ngram"]["acceptance"] or 0.0 for c in cells]
    ax.bar(xs, acc, 0.5, color="tab:blue")
    ax.set_xticks(list(xs), labels)
    ax.set(ylabel="drafts kept / proposed", title="acceptance", ylim=(0, 1))
    ax.grid(axis="y", alpha=0.3)
    ax = axes[2]
    for c in costs:
        ks = sorted(int(k) for k in c["ratio"])
        ax.plot(ks, [c["ratio"][k] for k in ks], "o-", label=f"{c['lanes']} lane(s): slope {c['draft_cost']:.3f}")
        ax.plot(ks, [1 + c["draft_cost"] * k for k in ks], ":", color="grey")
    ax.set(xlabel="drafts per lane k", ylabel="step time / plain decode step", title="verify cost (DRAFT_COST)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
