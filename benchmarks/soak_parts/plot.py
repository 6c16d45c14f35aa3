"""soak.png: the server's RSS, the requests in flight and the pool's chunks over the run."""

from __future__ import annotations

from benchmarks.common import pyplot


def plot(samples: list[dict], duration_s: float, path: str, title: str) -> None:
    plt = pyplot()
    if plt is None:
        return

    t = [s["t"] for s in samples]
    fig, (ax_rss, ax_load) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    ax_rss.plot(t, [s["rss_mib"] for s in samples], color="tab:blue", label="server RSS")
    ax_rss.set_ylabel("RSS (MiB)")
    ax_load.plot(t, [s["in_flight"] for s in samples], color="tab:orange", label="requests in flight (clients)")
    ax_load.plot(t, [s.get("running", float("nan")) for s in samples], color="tab:green", label="running (server)")
    ax_load.plot(t, [s.get("queued", float("nan")) for s in samples], color="tab:red", label="queued (server)")
    ax_load.set_ylabel("requests")
    ax_load.set_xlabel("seconds")
    ax_pool = ax_load.twinx()
    ax_pool.plot(t, [s.get("held", float("nan")) for s in samples], ":", color="tab:purple", label="chunks held")
    ax_pool.plot(t, [s.get("parked", float("nan")) for s in samples], ":", color="tab:gray", label="chunks parked")
    ax_pool.set_ylabel("KV chunks")
    for ax in (ax_rss, ax_load):
        for x in (duration_s / 3, 2 * duration_s / 3):
            ax.axvline(x, color="black", alpha=0.2)
        ax.grid(alpha=0.3)
    ax_rss.legend(fontsize=8, loc="lower right")
    lines = ax_load.get_legend_handles_labels()[0] + ax_pool.get_legend_handles_labels()[0]
    ax_load.legend(lines, [ln.get_label() for ln in lines], fontsize=8, loc="upper left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=75)
    plt.close(fig)
