"""Benchmarks and GPU ground-truth recording for xmem (not part of the installed package)."""
