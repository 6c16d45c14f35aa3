"""The parts of benchmarks/window.py: `interleave` runs one turn in two engines, single steps interleaved."""
