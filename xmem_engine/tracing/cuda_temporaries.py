"""Buffers that CUDA kernels allocate for themselves through the caching allocator, where the
CPU kernel the tracer runs allocates nothing.

Why: a few CUDA kernels make tensors of their own while they run, allocated and freed inside
one op. They never reach the dispatch modes (they are made in C++ below them), so the tracer
re-creates them from the op's arguments, with the sizes the CUDA source gives. Each rule
returns a short program of steps, ``("alloc", slot, nbytes)`` or ``("free", slot, 0)``, in
the order the kernel runs them; the tracer replays it right after the op's own outputs are
allocated (:meth:`Tracer.transients`).

Rules (PyTorch's ``aten/src/ATen/native``; the recordings in ``benchmarks/recordings.py``
show them on real GPUs):

* ``_index_put_impl_`` with ``accumulate=True`` (autograd's backward of ``x[idx]`` and of an
  embedding written as indexing, ``index_put_(..., accumulate=True)``) runs
  ``index_put_with_sort_kernel`` (``cuda/Indexing.cu``): ``makeLinearIndex`` /
  ``computeLinearIndex`` (``TensorAdvancedIndexing``/``IndexingUtils``) make each index
  tensor's ``remainder`` (``wrapIndexOnce``) and its product with the stride (the linear
  index; the remainder is freed at once), then the kernel makes ``sorted_indices`` and
  ``orig_indices`` (``empty_like`` of the linear index) and ``range`` (``arange``), all int64
  of the index count, and frees them in reverse order when it returns. CUB's own temporary
  storage for the radix sort is not re-created: its size is CUB's choice (1 B for 512 keys
  on the recorded runs), not given by PyTorch's source.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

Step = tuple[str, str, int]


def _broadcast_numel(tensors: list[torch.Tensor]) -> int:
    return torch.broadcast_shapes(*(t.shape for t in tensors)).numel()


def index_put_with_sort(args: tuple, kwargs: dict) -> list[Step] | None:
    names = ("self", "indices", "values", "accumulate", "unsafe")
    a = dict(zip(names, args), **kwargs)
    if not (a.get("accumulate") or torch.are_deterministic_algorithms_enabled()):
        return None  # index_put_kernel: no buffers of its own
    indices = [i for i in a["indices"] if i is not None]
    values = a["values"]
    if not indices or any(i.dtype in (torch.bool, torch.uint8) for i in indices):
        return None  # boolean masks go through nonzero first: not modelled here
    if any(i.dtype != torch.long for i in indices):
        return None  # int32 indices are converted first: not modelled here
    n = _broadcast_numel(indices)
    if n == 0 or values.numel() == 0:
        return None
    nbytes = n * 8
    steps: list[Step] = []
    for k in range(len(indices)):  # computeLinearIndex
        steps += [("alloc", f"remainder{k}", nbytes), ("alloc", f"index{k}", nbytes), ("free", f"remainder{k}", 0)]
        if k:  # linearIndex += index: the index goes
            steps.append(("free", f"index{k}", 0))
    steps += [("alloc", "sorted_indices", nbytes), ("alloc", "orig_indices", nbytes), ("alloc", "range", nbytes),
              ("free", "range", 0), ("free", "orig_indices", 0), ("free", "sorted_indices", 0), ("free", "index0", 0)]
    return steps


RULES: dict[Any, Callable[[tuple, dict], list[Step] | None]] = {
    torch.ops.aten._index_put_impl_.default: index_put_with_sort,
    torch.ops.aten.index_put_.default: index_put_with_sort,
    torch.ops.aten.index_put.default: index_put_with_sort,
}
