"""decode.py's figure: each arm's prefill, 1-lane and 8-lane decode speed as a ratio to one
peer (llama.cpp where it ran, else transformers), from the medians decode.py wrote.

    python -m benchmarks.decode_parts.plot [benchmarks/results/decode.json]   (re-draws the PNG)
"""

from __future__ import annotations

import json
import os
import sys

from benchmarks.common import pyplot

SPEEDS = [("prefill_tok_s", "prefill"), ("decode_tok_s", "decode, 1 lane"), ("decode8_tok_s", "decode, 8 lanes")]


def plot(median: dict[str, dict[str, float]], labels: dict[str, str], path: str) -> None:
    plt = pyplot()
    if plt is None:
        return

    # The peer the ratios are to: llama.cpp where it ran, else transformers; a --quick run has
    # neither (strata's arms only) and shows its arms relative to its first.
    peer = next((p for p in ("llama.cpp", "transformers") if p in median), next(iter(median)))
    arms = list(median)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        ratios = [median[arm][m] / median[peer][m] for m, _ in SPEEDS]
        bars = ax.bar([x + i * width for x in range(len(SPEEDS))], ratios, width, label=labels.get(arm, arm))
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([x + width * (len(arms) - 1) / 2 for x in range(len(SPEEDS))], [name for _, name in SPEEDS])
    ax.set_ylabel(f"tokens/s as a multiple of {peer}")
    ax.set_title(f"decode.py: tokens/s relative to {peer} (same model and machine, arms interleaved)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join("benchmarks", "results", "decode.json")
    with open(path) as f:
        data = json.load(f)
    from benchmarks.decode import labels

    out = os.path.splitext(path)[0] + ".png"
    plot(data["median"], labels(data.get("label", "Q4_1")), out)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
