"""The parts of benchmarks/spec.py (issue 14, speculative decoding), one concept per module.

`prompts` builds the two workloads (text that repeats its input; open chat); `arm` is one
engine stepped by hand with its decode steps timed; `interleave` steps the arms (spec on /
off) alternately, round by round; `draft_cost` measures a verify step's cost per extra row
(adaptive.py's DRAFT_COST); `summary` reduces rounds to medians and paired ratios and judges
the issue's targets; `tables` prints them; `plot` draws spec.png; `peer` looks for llama.cpp.
Nothing here imports torch or strata at import time, so `spec.py --help` stays fast.
"""
