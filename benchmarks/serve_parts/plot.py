"""serve.png: TTFT, time per output token, gaps between tokens and throughput against the
number of concurrent clients, one line per arm and percentile."""

from __future__ import annotations

from benchmarks.common import pyplot


def plot(summary: dict, arms: list[str], levels: list[int], path: str, title: str) -> None:
    plt = pyplot()
    if plt is None:
        return

    panels = [
        ("TTFT (s)", [("ttft_p50_s", "p50"), ("ttft_p90_s", "p90"), ("ttft_p99_s", "p99")]),
        ("time per output token (ms)", [("tpot_p50_ms", "p50"), ("tpot_p90_ms", "p90"), ("tpot_p99_ms", "p99")]),
        ("gap between tokens (ms)", [("itl_p50_ms", "all gaps p50"), ("itl_p99_ms", "all gaps p99"),
                                     ("stream_gap_p99_ms", "stream's largest p99")]),
        ("output tokens/s (all streams)", [("out_tok_s", "")]),
    ]
    colors = {"strata": "tab:blue", "llama.cpp": "tab:orange", "llama.cpp-tuned": "tab:red", "vllm": "tab:green"}
    styles = ["-", "--", ":"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    for ax, (name, series) in zip(axes.flat, panels):
        for arm in arms:
            for (key, label), style in zip(series, styles):
                ys = [summary[arm][str(c)][key] for c in levels]
                ax.plot(levels, ys, style, marker="o", color=colors.get(arm),
                        label=f"{arm} {label}".strip())
        ax.set_title(name)
        ax.set_xlabel("concurrent clients")
        ax.set_xticks(levels)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes.flat[2].set_yscale("log")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
