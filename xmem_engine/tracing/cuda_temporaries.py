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
* Reductions over dimensions (``sum``, ``mean``, ``amax``, ``max(dim)``, ``norm``, ``var``...)
  run ``gpu_reduce_kernel``, which allocates a staging buffer and its semaphores when it
  splits each output's inputs across thread blocks: sizes from the launch configuration,
  ported in ``cuda_reduce.py`` from ``cuda/Reduce.cuh`` and ``TensorIterator.cpp``; they depend
  on the GPU's SM count and threads per SM, so the rule reads the target GPU's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from xmem_engine.tracing.cuda_reduce import kernel_params, reduce_plan

Step = tuple[str, str, int]


@dataclass(frozen=True)
class Device:
    """What the rules need of the target GPU and the PyTorch that runs on it."""

    sm_count: int
    max_threads_per_sm: int
    torch_version: str


# cudaDeviceProp::maxThreadsPerMultiProcessor by compute capability (CUDA C++ Programming
# Guide, "Compute Capabilities", "Maximum number of resident threads per SM").
_THREADS_PER_SM = {(7, 5): 1024, (8, 6): 1536, (8, 7): 1536, (8, 9): 1536, (12, 0): 1536, (12, 1): 1536}


def device_of(props: Any) -> Device:
    cc = (int(props.major), int(props.minor))
    return Device(int(props.multi_processor_count), _THREADS_PER_SM.get(cc, 2048), torch.__version__)


def _broadcast_numel(tensors: list[torch.Tensor]) -> int:
    return torch.broadcast_shapes(*(t.shape for t in tensors)).numel()


def index_put_with_sort(args: tuple, kwargs: dict, device: Device) -> list[Step] | None:
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


def _dims(dim: Any, ndim: int) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(ndim))
    if isinstance(dim, int):
        return [dim]
    return list(dim)


def reduction(kind: str, dim_at: int | None, outputs: int = 1) -> Callable[[tuple, dict, Device], list[Step] | None]:
    """The rule of a reduction op: ``kind`` as in :func:`cuda_reduce.kernel_params`, the
    position of its ``dim`` argument (None: it reduces everything), its number of outputs."""

    def rule(args: tuple, kwargs: dict, device: Device) -> list[Step] | None:
        x = args[0]
        if not isinstance(x, torch.Tensor) or x.numel() == 0 or x.is_complex():
            return None
        dim = None
        if dim_at is not None:
            dim = args[dim_at] if len(args) > dim_at else kwargs.get("dim")
        out_dtype = kwargs.get("dtype") or x.dtype
        if kind in ("sum", "mean") and not out_dtype.is_floating_point:
            out_dtype = torch.long if not x.dtype.is_floating_point else out_dtype
        vt0, ivs, acc = kernel_params(kind, x.dtype, device.torch_version)
        out_size = torch.empty((), dtype=out_dtype).element_size() if kind not in ("any", "all") else 1
        sizes = (out_size, 8) if outputs == 2 else out_size
        plan = reduce_plan(tuple(x.shape), tuple(x.stride()), _dims(dim, x.dim()), x.element_size(), acc, sizes,
                           device.sm_count, device.max_threads_per_sm, vt0, ivs, device.torch_version,
                           x.storage_offset())
        return plan.steps() or None

    return rule


_aten = torch.ops.aten
RULES: dict[Any, Callable[[tuple, dict, Device], list[Step] | None]] = {
    _aten._index_put_impl_.default: index_put_with_sort,
    _aten.index_put_.default: index_put_with_sort,
    _aten.index_put.default: index_put_with_sort,
    _aten.sum.dim_IntList: reduction("sum", 1),
    _aten.sum.default: reduction("sum", None),
    _aten.mean.dim: reduction("mean", 1),
    _aten.mean.default: reduction("mean", None),
    _aten.amax.default: reduction("amax", 1),
    _aten.amin.default: reduction("amin", 1),
    _aten.max.dim: reduction("max_dim", 1, outputs=2),
    _aten.min.dim: reduction("min_dim", 1, outputs=2),
    _aten.max.default: reduction("max", None),
    _aten.min.default: reduction("min", None),
    _aten.argmax.default: reduction("argmax", 1),
    _aten.argmin.default: reduction("argmin", 1),
    _aten.linalg_vector_norm.default: reduction("norm", 2),
    _aten.var.correction: reduction("var", 1),
    _aten.std.correction: reduction("std", 1),
    _aten.var_mean.correction: reduction("var_mean", 1, outputs=2),
    _aten.std_mean.correction: reduction("std_mean", 1, outputs=2),
    _aten.prod.dim_int: reduction("prod", 1),
    _aten.any.dim: reduction("any", 1),
    _aten.all.dim: reduction("all", 1),
    _aten.any.dims: reduction("any", 1),
    _aten.all.dims: reduction("all", 1),
    _aten.any.default: reduction("any", None),
    _aten.all.default: reduction("all", None),
}
