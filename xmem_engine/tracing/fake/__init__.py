"""Fake tensors' values: the small tensors whose values are known (shadows), the values nobody
knows (guesses, placeholders for ``.item()``), and shortcuts and meta kernels that keep hot or
unsupported ops in fake mode.
"""
