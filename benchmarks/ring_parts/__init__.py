"""The parts of benchmarks/ring.py, one concept per module.

`geometry` turns `--scale` into tiers, rings and the arms' engine settings; `held` is one
arm's engine holding a synthetic conversation; `interleave` steps several held engines
alternately, round by round; `summary` reduces rounds to medians and paired ratios and
judges the seed's pre-registered rule; `tables` prints them; `plot` draws ring.png.
Nothing here imports torch or strata at import time, so `ring.py --help` stays fast.
"""

from __future__ import annotations

TURN = "\nUser: Summarise the log in one sentence.\nAssistant:"
TURN_CELLS = 16  # room for the turn's tokens (15 with the default tokenizer)
TRAINED_LENGTH = 8192  # SmolLM2-135M; longer synthetic contexts measure speed only
