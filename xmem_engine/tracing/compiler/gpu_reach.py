"""Whether a compiled call works on the virtual GPU, which decides whether it is compiled for
the target GPU or run as the host work it is (``torch_compile.CompiledCalls``).

A call reaches the GPU through its arguments, its module's parameters and buffers, or what
its function closes over or names as globals: PyTorch's recipe for compiling the optimizer
wraps ``opt.step()`` in a function of no arguments (``@torch.compile def fn(): opt.step()``),
which had been taken for host work and run eagerly without a word.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator

import torch


def reaches_gpu(fn: Any, args: tuple, kwargs: dict, is_gpu: Callable[[torch.Tensor], bool]) -> bool:
    """``fn(*args, **kwargs)`` touches a virtual-GPU tensor, as far as can be seen before it runs."""
    from torch.utils._pytree import tree_leaves

    if any(isinstance(x, torch.Tensor) and is_gpu(x) for x in tree_leaves((args, kwargs))):
        return True
    owner = getattr(fn, "__self__", fn)  # a bound method: nn.Module.compile's _call_impl, opt.step
    if isinstance(owner, torch.nn.Module):
        return holds_gpu(owner, is_gpu)
    return any(holds_gpu(o, is_gpu) for o in itertools.chain([owner] if owner is not fn else [], _closed_over(fn)))


def holds_gpu(obj: Any, is_gpu: Callable[[torch.Tensor], bool]) -> bool:
    """A virtual-GPU tensor, a module with one among its parameters and buffers, or an
    optimizer with one among its parameters."""
    if isinstance(obj, torch.Tensor):
        return is_gpu(obj)
    if isinstance(obj, torch.nn.Module):
        return any(is_gpu(p) for p in itertools.chain(obj.parameters(), obj.buffers()))
    if isinstance(obj, torch.optim.Optimizer):
        return any(isinstance(p, torch.Tensor) and is_gpu(p) for g in obj.param_groups for p in g["params"])
    return False


def _closed_over(fn: Any) -> Iterator[Any]:
    """The values ``fn``'s code closes over and the globals it names (one level deep)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            yield cell.cell_contents
        except ValueError:  # a cell not yet filled
            continue
    g = getattr(fn, "__globals__", None) or {}
    for name in code.co_names:
        if name in g:
            yield g[name]
