"""Pieces of benchmarks/moe_cache.py: synthetic routing traces (traces.py), the expert cache
on them against Belady's optimal eviction (cache.py), the device budget's split across
depths (budget.py), the figure (plot.py)."""
