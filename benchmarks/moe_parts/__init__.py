"""Pieces of benchmarks/moe.py (speed.py: strata against llama.cpp on a MoE GGUF) and of
benchmarks/moe_cache.py (traces.py: synthetic routing traces; cache.py: the expert cache on
them against Belady's optimal eviction; budget.py: the device budget's split across depths;
plot.py: its figure)."""
