"""session.png: save / restore / prefill time and MB/s against conversation length."""

from __future__ import annotations

from benchmarks.common import pyplot


def plot(summary: dict, lengths: list[int], path: str) -> None:
    plt = pyplot()
    if plt is None:
        return

    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(12, 4.5))
    for arm, label in [("save", "save"), ("restore_cold", "restore (cold cache)"),
                       ("restore_warm", "restore (warm cache)"), ("prefill", "recompute: prefill")]:
        xs = [n for n in lengths if summary[n][arm]]
        ax_t.plot(xs, [summary[n][arm]["s"] for n in xs], marker="o", label=label)
        if arm != "prefill":
            ax_r.plot(xs, [summary[n]["save"]["bytes"] / 2**20 / summary[n][arm]["s"] for n in xs], marker="o",
                      label=label)
    ax_t.set(xscale="log", yscale="log", xlabel="conversation cells", ylabel="seconds", title="time (median)")
    ax_r.set(xscale="log", xlabel="conversation cells", ylabel="MB/s (MiB of file per second)", title="throughput")
    for ax in (ax_t, ax_r):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("strata session files, SmolLM2-135M K/V geometry (bf16, 22.5 KiB/cell), synthetic K/V", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
